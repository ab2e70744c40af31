"""Silver's session windows (DESIGN §2c) equal the reference model's, exactly: the
sessions with their ids, revisions, statuses and merges, the quarantine and the
watermark history, on random streams over random micro-batching, and every record
counted once."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from spark_jobs.engine.late_merge import TimeRange, merge_late
from spark_jobs.eventtime.sessions import MERGED, ReferenceSessions, SessionModelResult
from spark_jobs.eventtime.windows import SessionSpec
from spark_jobs.generator import land_files
from spark_jobs.tables import TableRegistry
from tests.integration.engine import (
    BASE_MS,
    engine_config,
    engine_history,
    engine_quarantine,
    model_batches,
    model_history,
    model_quarantine,
    payload,
    replay_batches,
    run_jobs,
)
from tests.integration.test_crash_points import run_crashing, stream
from tests.integration.test_silver_matches_model import BOUND_0S, batched
from tests.unit.test_session_model import naive_cut_sessions, naive_sessions

pytestmark = [pytest.mark.spark, pytest.mark.slow]

# Each example replays, then merges: fewer than the windows' six, the explicit one beside them.
EXAMPLES = int(os.environ.get("TIDEMARK_ENGINE_EXAMPLES", "3"))
SESSION_3S = {"type": "session", "gap": "3s"}
# Cut every 4 s (the base time is a multiple of 4 s).
SESSION_3S_CUT_4S = {"type": "session", "gap": "3s", "max_duration": "4s"}


def engine_sessions(spark, registry: TableRegistry) -> dict:
    """session_id -> (key, (start_ms, end_ms), record_count, measures, revision, status, merged_into)."""
    config = registry.config
    frame = (
        spark.read.format("delta")
        .load(registry.silver.path)
        .selectExpr(
            *config.key,
            "session_id",
            "unix_millis(session_start) AS start_ms",
            "unix_millis(session_end) AS end_ms",
            "record_count",
            *config.measure_columns,
            "revision",
            "status",
            "merged_into",
        )
    )
    return {
        row.session_id: (
            tuple(row[k] for k in config.key),
            (row.start_ms, row.end_ms),
            row.record_count,
            {m: _approx(row[m]) for m in config.measure_columns},
            row.revision,
            row.status,
            row.merged_into,
        )
        for row in frame.collect()
    }


def model_sessions(result: SessionModelResult) -> dict:
    return {
        s.session_id: (
            s.key,
            (s.extent.start, s.extent.end),
            s.record_count,
            {m: _approx(v) for m, v in s.measures.items()},
            s.revision,
            s.status,
            s.merged_into,
        )
        for s in result.sessions.values()
    }


def _approx(value):
    """Sums of doubles depend on the order they are added in; compare them to 1e-9."""
    return round(value, 9) if isinstance(value, float) else value


def assert_sessions_reconcile(spark, registry: TableRegistry, records: Sequence[dict]) -> None:
    """Every bronze record counted once: in a session not merged away, or quarantined
    and not merged yet."""
    assert spark.read.format("delta").load(registry.bronze.path).count() == len(records)
    silver = spark.read.format("delta").load(registry.silver.path).where(f"status != '{MERGED}'")
    counted = silver.groupBy().sum("record_count").first()[0] or 0
    pending = spark.read.format("delta").load(registry.quarantine.path).where("status = 'pending'").count()
    assert counted + pending == len(records)


def assert_sessions_equal_model(
    spark, registry: TableRegistry, batches, expected: SessionModelResult
) -> None:
    assert engine_sessions(spark, registry) == model_sessions(expected)
    assert engine_quarantine(spark, registry) == model_quarantine(expected)
    assert engine_history(spark, registry) == model_history(expected)
    assert_sessions_reconcile(spark, registry, [record for batch in batches for record in batch])


def batch_sessionization(records: Sequence[dict], spec: SessionSpec) -> dict:
    """Per key, the sessions of all ``records`` at once: (start, end, record count)."""
    keys = sorted({(r["region"], r["device_id"]) for r in records})
    found = {}
    for key in keys:
        protos = [(r["ts"], r["ts"] + spec.gap_ms) for r in records if (r["region"], r["device_id"]) == key]
        every = spec.max_duration_ms
        found[key] = naive_sessions(protos) if every is None else naive_cut_sessions(protos, every)
    return found


def live_sessions(spark, registry: TableRegistry) -> dict:
    """Per key, silver's sessions not merged into another: (start, end, record count)."""
    found: dict = {}
    for key, extent, count, _, _, status, _ in sorted(engine_sessions(spark, registry).values()):
        if status != MERGED:
            found.setdefault(key, []).append((*extent, count))
    return found


@pytest.fixture(scope="module")
def lakehouse(tmp_path_factory):
    return tmp_path_factory.mktemp("sessions")


def at(partition: int, seconds: float, device: str = "d1", battery: float = 1.0) -> dict:
    return payload(partition, BASE_MS + int(seconds * 1000), device, battery, 1.0)


watermarks = st.sampled_from(
    [{"strategy": "bounded", "max_out_of_orderness": "2s"}, BOUND_0S, {"strategy": "monotonous"}]
)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    batches=batched(),
    window=st.sampled_from([SESSION_3S, {"type": "session", "gap": "1s"}, SESSION_3S_CUT_4S]),
    watermark=watermarks,
    idleness=st.sampled_from([None, "1ms"]),
    silver_every_batch=st.booleans(),
    lateness=st.sampled_from(["0s", "3s"]),
    flush=st.booleans(),
)
# A record older than the watermark by less than the gap, its key's session closed:
# the tombstone sends it to the quarantine rather than open an overlapping session.
# The records after it chain on from it (one run), so the run is judged a record at a
# time: the rest are counted and join the open session at 10 s.
@example(
    batches=[[at(0, 0)], [at(0, 10)], [at(0, 2.5), at(0, 5), at(0, 7.5), at(0, 9)]],
    window=SESSION_3S,
    watermark=BOUND_0S,
    idleness=None,
    silver_every_batch=False,
    lateness="0s",
    flush=True,
)
# Cuts every 4 s: 2 s and 4 s meet at one in one batch, so they are two sessions (two
# runs). 3.5 s meets the tombstone [4 s, 7 s) only at the cut: not late for touching it,
# but cleaned on its own; the merge folds it into the closed [2 s, 4 s).
@example(
    batches=[[at(0, 2), at(0, 4)], [at(0, 10)], [at(0, 3.5), at(0, 9)]],
    window=SESSION_3S_CUT_4S,
    watermark=BOUND_0S,
    idleness=None,
    silver_every_batch=True,
    lateness="0s",
    flush=False,
)
def test_silver_sessions_quarantine_and_history_equal_the_reference_model(
    spark, lakehouse, batches, window, watermark, idleness, silver_every_batch, lateness, flush
):
    config = engine_config(window, {**watermark, "idleness": idleness}, lateness)
    registry = replay_batches(
        spark, config, lakehouse, batches, flush=flush, silver_every_batch=silver_every_batch
    )
    model = ReferenceSessions(config.rules())
    model.run(model_batches(config, batches), flush=flush)
    assert_sessions_equal_model(spark, registry, batches, model.result())

    # The late merge folds the quarantine back in: the model's sessions again, and
    # those of a batch sessionization of every record.
    merge_late(spark, registry, TimeRange())
    model.fold_late()
    assert_sessions_equal_model(spark, registry, batches, model.result())
    records = [record for batch in batches for record in batch]
    assert live_sessions(spark, registry) == batch_sessionization(records, config.window)


# After the sessions' commit, a replay judges the batch again; after the merge's silver
# write, a rerun finishes the merge. (The other writes are the windows' own, crashed in
# test_crash_points.py.)
@pytest.mark.parametrize("crash_after", ["silver:windows", "merge_late:silver"])
def test_a_crash_right_after_a_session_write_then_a_restart_gives_the_uninterrupted_answer(
    spark, tmp_path, monkeypatch, crash_after
):
    """Crashed in the micro-batch that quarantines a record (or in the merge that folds
    it in), then restarted: the sessions, the quarantine and the history are the model's."""
    config = engine_config(SESSION_3S, {**BOUND_0S, "idleness": "1ms"})
    registry = TableRegistry(config, str(tmp_path / config.name))
    # The last batch quarantines 2.5 s (its key's closed session ends at 3 s) and counts
    # 13 s into d2's open session, which the same batch then closes: judged again
    # against the sessions as that batch left them, 13 s would look late.
    batches = [
        [at(0, 0), at(1, 1, "d2")],
        [at(0, 10), at(1, 11, "d2")],
        [at(0, 2.5), at(0, 20), at(1, 13, "d2"), at(1, 30, "d2")],
    ]
    for index, records in enumerate(batches):
        land_files([[json.dumps(record) for record in records]], registry.landing_path, "json")
        run_jobs(spark, registry, "bronze")
        crashes = [crash_after] if index == len(batches) - 1 and crash_after.startswith("silver") else []
        run_crashing(monkeypatch, crashes, stream(spark, registry, "silver"))
    model = ReferenceSessions(config.rules())
    model.run(model_batches(config, batches))
    assert len(model.quarantined) == 1
    quarantine = spark.read.format("delta").load(registry.quarantine.path)
    assert [row.reason for row in quarantine.collect()] == ["session_closed"]
    assert_sessions_equal_model(spark, registry, batches, model.result())

    merge = lambda: merge_late(spark, registry, TimeRange())  # noqa: E731
    run_crashing(monkeypatch, [crash_after] if crash_after.startswith("merge") else [], merge)
    model.fold_late()
    assert_sessions_equal_model(spark, registry, batches, model.result())
