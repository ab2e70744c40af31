"""Every crash point between two writes, deterministically: bronze, silver, gold,
offline detection, the idleness check's step, the end of input and the late merge,
each crashed right after each of its
writes (``TIDEMARK_CRASH_AFTER``), in the first micro-batch and a later one, with
and without late records, then run again. Every table must then hold what a run
without a crash holds, row for row (wall-clock columns aside), and reconcile.

The jobs run in this test's session and the crash raises (``TIDEMARK_CRASH_BY=raise``):
the stream fails as a killed one stops, leaving what committed and replaying its
micro-batch on the next run. Real SIGKILLs are in the fault-injection and kill-9
tests."""

from __future__ import annotations

import json
import re
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from spark_jobs.engine import late_merge, watermark_steps
from spark_jobs.eventtime.sessions import MERGED
from spark_jobs.eventtime.windows import SessionSpec
from spark_jobs.faults import CRASH_AFTER_VARIABLE, CRASH_BY_VARIABLE, INJECTED_CRASHES, InjectedCrash
from spark_jobs.generator import land_files
from spark_jobs.jobs import silver
from spark_jobs.tables import TableRegistry
from spark_jobs.transforms.gold import count_column
from tests.integration.engine import BASE_MS, engine_config, payload, run_job_once, window_pairs_of

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TUMBLING_10S = {"type": "tumbling", "size": "10s", "offset": "0s"}
# Partitions idle after a millisecond: the idleness check's step always moves.
WATERMARK = {"strategy": "bounded", "max_out_of_orderness": "0s", "idleness": "1ms"}
MALFORMED = "{not json"


def at(seconds: int, partition: int) -> dict:
    return payload(partition, BASE_MS + seconds * 1000, f"d{partition}", float(seconds), 1.0)


# The first batch leaves the watermark at 24,999 ms.
FIRST = [at(3, 0), at(25, 0), at(3, 1), at(25, 1)]
# The first batch's records are on time against -inf; its own watermark-after would
# make the 3 s ones late. In the later batch 2 s is late; 27 s is on time at the
# batch's start, but its own watermark-after (39,999 ms) would clean its windows.
LATER = [at(2, 0), at(27, 0), at(60, 0), at(27, 1), at(40, 1)]

SILVER_WRITES = ["silver:windows", "silver:history", "silver:clocks"]
# The idleness step's, the end of input's and gold's after them; the late merge's own.
STEP_WRITES = ["idle:fire", "idle:history", "idle:clocks", "flush:fire", "flush:history", "gold:gold"]
MERGE_WRITES = ["merge_late:claim", "merge_late:silver", "merge_late:gold", "merge_late:mark"]
# Where each job crashes, per micro-batch (0, 1) and after the batches ("end": the
# idleness step, the end of input, offline detection after it): right after each of
# its writes in turn, each restart replaying what the crash left. A crash after write
# n leaves writes 1..n committed, however many restarts came before, so this crashes
# right after every write once: silver's in the first micro-batch (no late records,
# but records older than its own watermark-after) and in a later one with late
# records; bronze's, offline detection's, the idleness step's and the flush's.
PLAN = {
    0: ["bronze:bronze", *SILVER_WRITES, "gold:gold", "offline:state"],
    1: [
        "bronze:rejects",
        "silver:windows",
        "silver:quarantine",
        *SILVER_WRITES[1:],
        "offline:late",
        "offline:state",
    ],
    "end": [
        *STEP_WRITES,
        "offline:events",
        # After a crash at its claim, a rerun finishes that run's silver, gold and mark
        # before it claims the late tracks.
        *MERGE_WRITES,
        "merge_late:claim_tracks",
        "merge_late:rederive",
    ],
}


def crashing(monkeypatch, step: str | None):
    if step is None:
        monkeypatch.delenv(CRASH_AFTER_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(CRASH_AFTER_VARIABLE, step)
        monkeypatch.setenv(CRASH_BY_VARIABLE, "raise")


def crash_once(monkeypatch, step: str, action) -> None:
    """``action`` run until it crashes right after ``step``, and only there."""
    crashing(monkeypatch, step)
    crashes = len(INJECTED_CRASHES)
    try:
        action()
    except InjectedCrash:
        pass  # the step functions raise it; a stream's failed run is raised as one too
    else:
        raise AssertionError(f"the scenario never reached the crash point {step}")
    finally:
        crashing(monkeypatch, None)
    assert INJECTED_CRASHES[crashes:] == [step], f"the run failed otherwise than by a crash at {step}"


def run_crashing(monkeypatch, steps: list[str], action) -> None:
    """``action`` crashed right after each of ``steps`` in turn, each time run again
    as a restarted job would be, then once without a crash."""
    for step in steps:
        crash_once(monkeypatch, step, action)
    action()


def crash_in(plan: dict, batch: int | str, job: str) -> list[str]:
    return [step for step in plan.get(batch, ()) if step.split(":")[0] == job]


def stream(spark, registry: TableRegistry, job: str):
    def run() -> None:
        code = run_job_once(spark, registry, job)
        if code != 0:
            raise InjectedCrash(job)

    return run


def scenario(
    spark,
    tmp_path,
    monkeypatch,
    plan: dict,
    watermark: dict = WATERMARK,
    window: dict = TUMBLING_10S,
) -> dict:
    """Two micro-batches through bronze, silver, gold and (for windows) offline
    detection, an idleness step, the end of input, gold and offline detection after it,
    and the late merge; crashed right after each write ``plan`` names for a micro-batch
    (or "end"), and restarted. Returns the tables' contents (:func:`tables`)."""
    sessions = window["type"] == "session"
    config = engine_config(
        window,
        watermark,
        "0s",
        offline=None if sessions else {"timeout": "30m", "key": ["device_id"]},
        gold={"name": "minutely", "grain": "1m", "group_by": ["region"]},
    )
    registry = TableRegistry(config, str(tmp_path / config.name))
    jobs = ("bronze", "silver", "gold") if sessions else ("bronze", "silver", "gold", "offline")
    batches = [FIRST, LATER]
    for index, records in enumerate(batches):
        lines = [json.dumps(record) for record in records]
        land_files([[*lines, MALFORMED] if index else lines], registry.landing_path, "json")
        for job in jobs:
            run_crashing(monkeypatch, crash_in(plan, index, job), stream(spark, registry, job))
    for what, action in (
        ("idle", lambda: watermark_steps.advance_idle(spark, registry, datetime.now(UTC))),
        ("flush", lambda: watermark_steps.flush(spark, registry)),
        *((job, stream(spark, registry, job)) for job in jobs[2:]),
        ("merge_late", lambda: late_merge.merge_late(spark, registry, late_merge.TimeRange())),
    ):
        run_crashing(monkeypatch, crash_in(plan, "end", what), action)
    records = [record for batch in batches for record in batch]
    return tables(spark, registry, records)


def tables(spark, registry: TableRegistry, records: list[dict]) -> dict:
    """Each table's rows without wall-clock columns (they differ between any two runs)."""

    def rows(path: str, *columns: str, where: str = "true") -> Counter:
        frame = spark.read.format("delta").load(path).where(where).selectExpr(*columns)
        return Counter(tuple(row) for row in frame.collect())

    config = registry.config
    sessions = isinstance(config.window, SessionSpec)
    pipeline = f"pipeline = '{config.name}'"
    extent = (
        ("session_id", "unix_millis(session_start)", "unix_millis(session_end)")
        if sessions
        else ("unix_millis(window_start)", "region", "device_id")
    )
    lifecycle = (
        ("revision", "status", "merged_into", "tier")
        if sessions
        else ("revision", "status", "late_merged_count")
    )
    contents = {
        "bronze": rows(registry.bronze.path, "source_partition", "ts", "device_id", "battery"),
        "rejects": rows(registry.ops["rejects"].path, "raw_record", "reason", where=pipeline),
        "silver": rows(registry.silver.path, *extent, "record_count", *config.measure_columns, *lifecycle),
        "quarantine": rows(
            registry.quarantine.path,
            "source_partition",
            "ts",
            "unix_millis(window_start)",
            "unix_millis(window_end)",
            "watermark",
            "lateness_ms",
            "status",
        ),
        # A rerun finishes an interrupted merge; it does not start a second one.
        "merge_runs": rows(registry.quarantine.path, "count(DISTINCT merge_run_id)"),
        "gold": rows(
            registry.gold.path,
            "unix_millis(grain_start)",
            "region",
            "record_count",
            count_column(config),
            "key_count",
            *config.measure_columns,
        ),
        "history": rows(
            registry.ops["watermark_history"].path,
            "watermark",
            "active_partitions",
            "idle_partitions",
            "on_time_count",
            "late_count",
            # The clocks a step carries, less their wall-clock moment of last data.
            "to_json(transform(partition_clocks, c -> struct(c.source_partition, c.max_event_ms, "
            "c.partition_watermark, c.is_idle, c.is_aligned, c.generator_state)))",
            where=pipeline,
        ),
        "clocks": rows(
            registry.ops["watermarks"].path,
            "source_partition",
            "unix_millis(max_event_time)",
            "partition_watermark",
            "is_idle",
            "is_aligned",
            "generator_state",
            where=pipeline,
        ),
    }
    if config.offline is not None:
        contents |= {
            "status_events": rows(
                registry.status_events.path, "device_id", "status", "unix_millis(event_time)", "watermark"
            ),
            "late_tracks": rows(
                registry.late_tracks.path, "device_id", "ts", "watermark", "lateness_ms", "status"
            ),
            "offline_state": rows(
                registry.offline_state.path, "kind", "device_id", "ts_ms", "status", "version"
            ),
        }
    # Nothing lost, nothing doubled: every input line is a reject or a bronze row.
    assert sum(contents["bronze"].values()) + sum(contents["rejects"].values()) == len(records) + 1
    silver_table = spark.read.format("delta").load(registry.silver.path)
    quarantined = sum(contents["quarantine"].values())
    merged = sum(n for row, n in contents["quarantine"].items() if row[-1] == "merged")
    if sessions:
        # Every record once: in a session not merged away (merged late records
        # included), or in the quarantine, still pending.
        held = silver_table.where(f"status != '{MERGED}'").selectExpr("sum(record_count)").first()[0]
        assert held + quarantined - merged == len(records)
        return contents
    # Every (record, window) pair once, on time in silver or in the quarantine; and
    # silver holds each merged quarantine row once more, as a late-merged record.
    counted, late_merged = silver_table.selectExpr("sum(record_count)", "sum(late_merged_count)").first()
    assert counted - late_merged + quarantined == window_pairs_of(config, records)
    assert late_merged == merged
    return contents


def test_a_crash_right_after_any_write_then_a_restart_leaves_the_tables_of_a_run_without_crashes(
    spark, tmp_path, monkeypatch
):
    uncrashed = scenario(spark, tmp_path / "uncrashed", monkeypatch, {})
    # The scenario means what it says: one late record (and track) in the later batch,
    # merged by the late merge, and status events once the input ends.
    assert [row[-1] for row in uncrashed["quarantine"].elements()] == ["merged"]
    assert [row[-1] for row in uncrashed["late_tracks"].elements()] == ["merged"]
    assert uncrashed["status_events"], "the end of input must emit status events"

    crashed = scenario(spark, tmp_path / "crashed", monkeypatch, PLAN)

    for table, rows in uncrashed.items():
        assert crashed[table] == rows, f"{table} differs after the crashes"


# A stateful custom generator: a bound of 20 s for each partition's first batch, 0 s
# after. The first batch leaves the watermark at 4,999 ms (nothing in the later one is
# late), the later one at 39,999 ms; a restart that lost the generators' state would
# take the 20 s bound again and stop at 19,999 ms.
STATEFUL = {
    "strategy": "custom",
    "generator": "tests.unit.user_generators:ShrinkingBound",
    "options": {"start": 20_000, "step": 20_000},
    "idleness": "1ms",
}
STATEFUL_PLAN = {0: SILVER_WRITES, 1: SILVER_WRITES, "end": ["idle:fire", "idle:history", "idle:clocks"]}


def test_crashes_with_a_stateful_custom_generator_leave_the_tables_of_a_run_without_crashes(
    spark, tmp_path, monkeypatch
):
    uncrashed = scenario(spark, tmp_path / "uncrashed", monkeypatch, {}, STATEFUL)
    watermarks = sorted(row[0] - BASE_MS for row in uncrashed["history"].elements())
    assert watermarks[:2] == [4_999, 39_999]
    state = {"generator": STATEFUL["generator"], "state": {"bound": 0}}
    assert [json.loads(row[-1]) for row in uncrashed["clocks"]] == [state, state]  # both partitions

    crashed = scenario(spark, tmp_path / "crashed", monkeypatch, STATEFUL_PLAN, STATEFUL)

    for table, rows in uncrashed.items():
        assert crashed[table] == rows, f"{table} differs after the crashes"


def test_the_plans_crash_right_after_every_write_the_jobs_mark():
    sources = Path(silver.__file__).resolve().parents[1]
    marked = {
        step
        for source in sources.rglob("*.py")
        for step in re.findall(r'crash_point\("([a-z_-]+:[a-z_]+)"\)', source.read_text())
    }
    planned = {step for steps in PLAN.values() for step in steps}
    # The offline stream's fold of tracks a merge claimed: test_late_merge crashes there.
    # Maintenance's OPTIMIZE changes no row: the storm (test_fault_injection) kills it there.
    assert marked == planned | {"offline:fold", "maintenance:optimize"}


# Three bronze versions one silver trigger judges together: the first opens window
# [0 s, 10 s) on time, the second moves the watermark past it, the third's record
# falls in it late. One micro-batch holds the window's on-time and late pairs.
ONE_TRIGGER = [[at(3, 0), at(3, 1)], [at(25, 0), at(25, 1)], [at(2, 0)]]


def late_merge_meanwhile(spark, tmp_path: Path, monkeypatch, crash_after: str | None) -> Counter:
    """``ONE_TRIGGER`` through bronze and one silver trigger, crashed right after
    ``crash_after`` (or not); a late merge, silver's restart, a late merge again.
    Returns silver's rows, checked to reconcile."""
    config = engine_config(TUMBLING_10S, {"strategy": "bounded", "max_out_of_orderness": "0s"})
    registry = TableRegistry(config, str(tmp_path / config.name))
    for records in ONE_TRIGGER:
        land_files([[json.dumps(record) for record in records]], registry.landing_path, "json")
        assert run_job_once(spark, registry, "bronze") == 0
    silver_trigger = stream(spark, registry, "silver")
    if crash_after is None:
        silver_trigger()
    else:
        crash_once(monkeypatch, crash_after, silver_trigger)
    late_merge.merge_late(spark, registry, late_merge.TimeRange())
    silver_trigger()
    late_merge.merge_late(spark, registry, late_merge.TimeRange())
    windows = spark.read.format("delta").load(registry.silver.path)
    rows = Counter(
        tuple(row)
        for row in windows.selectExpr(
            "unix_millis(window_start)",
            "device_id",
            "record_count",
            "revision",
            "status",
            "late_merged_count",
        ).collect()
    )
    counted, late_merged = windows.selectExpr("sum(record_count)", "sum(late_merged_count)").first()
    quarantined = spark.read.format("delta").load(registry.quarantine.path)
    assert quarantined.where("status = 'merged'").count() == quarantined.count() == late_merged == 1
    records = [record for batch in ONE_TRIGGER for record in batch]
    assert counted - late_merged + quarantined.count() == window_pairs_of(config, records)
    return rows


@pytest.mark.parametrize("crash_after", [None, "silver:windows", "silver:quarantine", "silver:history"])
def test_a_late_merge_between_a_crash_and_the_restart_merges_each_late_pair_into_its_one_window(
    spark, tmp_path, monkeypatch, crash_after
):
    silver_rows = late_merge_meanwhile(spark, tmp_path, monkeypatch, crash_after)

    # The watermark ends at 24,999 ms: [0 s, 10 s) fired and closed (no lateness), d0's
    # holding its on-time record and, merged, its late one; [20 s, 30 s) still open.
    assert silver_rows == Counter(
        {
            (BASE_MS, "d0", 2, 2, "closed", 1): 1,
            (BASE_MS, "d1", 1, 1, "closed", 0): 1,
            (BASE_MS + 20_000, "d0", 1, 0, "open", 0): 1,
            (BASE_MS + 20_000, "d1", 1, 0, "open", 0): 1,
        }
    )
