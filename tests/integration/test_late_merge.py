"""Gold and the late merge against real Spark and Delta: after the merge, silver
and gold equal a plain batch computation over all of bronze (eventual exactness)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from spark_jobs.config import load_pipeline
from spark_jobs.engine import detector, late_merge
from spark_jobs.eventtime.clock import MAX_WATERMARK
from spark_jobs.faults import CRASH_AFTER_VARIABLE, CRASH_BY_VARIABLE, INJECTED_CRASHES
from spark_jobs.generator import START_MS, FleetSpec, generate
from spark_jobs.jobs import gold, merge_late, offline
from spark_jobs.jobs import silver as silver_job
from spark_jobs.jobs.common import JobContext
from spark_jobs.jobs.replay import replay
from spark_jobs.lakehouse.log import table_version
from spark_jobs.lakehouse.transaction import Transaction
from spark_jobs.tables import TableRegistry, join
from tests.integration.conftest import (
    delta_commits,
    kill_hard,
    write_pipeline,
)
from tests.integration.lakehouse_sql import (
    batch_gold,
    batch_silver,
    batch_status_events,
    engine_gold,
    engine_silver,
    engine_status_events,
    not_quarantined,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]
HOUR_MS = 3_600_000


def replayed_fleet(
    spark, folder: Path, devices: int, duration_ms: int, flush: bool = True
) -> tuple[Path, TableRegistry]:
    """Generated telemetry with truly late records (10-30 min), replayed live-like
    (small batches) and, with ``flush``, flushed: the late records sit in the quarantine."""
    pipeline = write_pipeline(folder)
    fleet = generate(
        FleetSpec(devices=devices, partitions=3, seed=11, duration_ms=duration_ms, late_ratio=0.05)
    )
    source = folder / "fleet.json"
    source.write_text("\n".join(record.line for record in fleet) + "\n")
    lakehouse = folder / "lakehouse"
    config = load_pipeline(pipeline)
    assert replay(spark, config, source, str(lakehouse), batch_size=500, flush=flush) == 0
    return pipeline, TableRegistry(config, str(lakehouse))


@pytest.fixture(scope="module")
def unflushed_fleet(spark, tmp_path_factory) -> Path:
    """A small fleet replayed without the end of input: its late records and tracks
    are pending. Built once; each test works on its own copy (:func:`copy_of`)."""
    folder = tmp_path_factory.mktemp("unflushed-fleet")
    replayed_fleet(spark, folder, devices=4, duration_ms=40 * 60_000, flush=False)
    return folder


def copy_of(replayed: Path, folder: Path) -> tuple[Path, TableRegistry]:
    """A copy of a :func:`replayed_fleet` folder (Delta tables and stream checkpoints
    refer to their files relatively): its pipeline file and tables."""
    copy = folder / replayed.name
    shutil.copytree(replayed, copy)
    (pipeline,) = copy.glob("*.yaml")
    return pipeline, TableRegistry(load_pipeline(pipeline), str(copy / "lakehouse"))


def quarantine_by_status(spark, registry: TableRegistry) -> dict[str, int]:
    rows = spark.read.format("delta").load(registry.quarantine.path).groupBy("status").count().collect()
    return {row.status: row["count"] for row in rows}


def assert_reconciles(spark, registry: TableRegistry) -> None:
    """Every bronze record (tumbling windows: one pair each) counted exactly once:
    on time in silver, or quarantined, whether merged yet or not."""
    bronze = spark.read.format("delta").load(registry.bronze.path).count()
    silver = spark.sql(
        f"SELECT sum(record_count) AS n, sum(late_merged_count) AS late FROM delta.`{registry.silver.path}`"
    ).first()
    statuses = quarantine_by_status(spark, registry)
    assert silver.n - silver.late + sum(statuses.values()) == bronze
    assert silver.late == statuses.get("merged", 0)


def statuses_of(spark, path: str) -> set[str]:
    return {row.status for row in spark.read.format("delta").load(path).select("status").distinct().collect()}


def versions(*paths: str) -> list[int]:
    return [delta_commits(path) for path in paths]


def test_after_the_late_merge_silver_and_gold_equal_a_batch_computation_over_bronze(spark, tmp_path, capsys):
    pipeline, registry = replayed_fleet(spark, tmp_path, devices=8, duration_ms=90 * 60_000)
    lakehouse = registry.root
    # The replay drained gold and offline detection side by side: their runs overlap.
    runs = spark.read.format("delta").load(registry.ops["runs"].path).where("status = 'succeeded'")
    ran = {row.job: row for row in runs.collect()}
    assert (
        ran["offline"].started_at < ran["gold"].ended_at and ran["gold"].started_at < ran["offline"].ended_at
    )
    args = ["--pipeline", str(pipeline), "--lakehouse", lakehouse]
    late = quarantine_by_status(spark, registry)
    assert set(late) == {"pending"} and late["pending"] > 20
    assert_reconciles(spark, registry)
    late_track_statuses = statuses_of(spark, registry.late_tracks.path)
    # Before the merge, silver and gold hold exactly the on-time records.
    on_time = not_quarantined(registry)
    assert engine_silver(spark, registry) == batch_silver(spark, registry, on_time)
    gold_before = engine_gold(spark, registry)
    assert gold_before == batch_gold(spark, registry, on_time)

    # A dry run reports the pending records and their windows, and writes nothing.
    tables = (registry.silver.path, registry.gold.path, registry.quarantine.path)
    untouched = versions(*tables)
    assert merge_late.main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    windows = spark.sql(
        f"SELECT count(DISTINCT window_start, region, device_id) FROM delta.`{registry.quarantine.path}`"
    ).first()[0]
    # The windows only late records fell in, which silver does not hold yet.
    new = spark.sql(
        f"SELECT count(*) FROM (SELECT DISTINCT window_start, window_end, region, device_id "
        f"FROM delta.`{registry.quarantine.path}`) "
        f"LEFT ANTI JOIN delta.`{registry.silver.path}` USING (window_start, window_end, region, device_id)"
    ).first()[0]
    assert f"pending late records: {late['pending']}" in out
    assert f"silver windows: {windows} ({windows - new} get revision + 1, {new} new)" in out
    assert versions(*tables) == untouched

    # A merge of the first hour's windows touches only the first hour.
    first_hour = f"window_start < timestamp_millis({START_MS + HOUR_MS})"
    first_hour_late = spark.sql(
        f"SELECT count(*) FROM delta.`{registry.quarantine.path}` WHERE {first_hour}"
    ).first()[0]
    assert 0 < first_hour_late < late["pending"]
    hour_end = "2026-01-01T01:00:00Z"
    assert merge_late.main([*args, "--from", "2026-01-01T00:00:00Z", "--to", hour_end]) == 0
    statuses = quarantine_by_status(spark, registry)
    assert statuses == {"merged": first_hour_late, "pending": late["pending"] - first_hour_late}
    gold_partial = engine_gold(spark, registry)
    for (grain_ms, region), row in gold_partial.items():
        if grain_ms >= START_MS + HOUR_MS:
            assert row == gold_before[(grain_ms, region)]
    assert gold_partial != gold_before
    assert_reconciles(spark, registry)

    # The full merge (Airflow's spark-submitted merges are in the e2e and soak runs).
    assert merge_late.main(args) == 0
    reported_new = [int(n) for n in re.findall(r"windows \((\d+) new\)", capsys.readouterr().out)]
    assert len(reported_new) == 2 and sum(reported_new) == new
    assert quarantine_by_status(spark, registry) == {"merged": late["pending"]}
    assert engine_silver(spark, registry) == batch_silver(spark, registry)
    assert engine_gold(spark, registry) == batch_gold(spark, registry)
    # Offline detection's late tracks are folded in too: its status history was
    # re-derived for their devices and equals the batch computation.
    assert late_track_statuses == {"pending"}
    assert statuses_of(spark, registry.late_tracks.path) == {"merged"}
    assert engine_status_events(spark, registry) == batch_status_events(spark, registry)
    assert_reconciles(spark, registry)
    merged = spark.sql(
        f"SELECT count(*) AS n, count(DISTINCT merge_run_id) AS runs, count(merged_at) AS stamped "
        f"FROM delta.`{registry.quarantine.path}`"
    ).first()
    assert (merged.n, merged.runs, merged.stamped) == (late["pending"], 2, late["pending"])
    revised = spark.sql(
        f"SELECT count(*) FROM delta.`{registry.silver.path}` "
        "WHERE late_merged_count > 0 AND revision < 2 AND record_count > late_merged_count"
    ).first()[0]
    assert revised == 0, "a window that had fired and then took late records must be at revision >= 2"

    # Idempotent: a second merge finds nothing and changes no table.
    settled = versions(*tables)
    assert merge_late.main(args) == 0
    assert versions(*tables) == settled

    # The gold stream, picking up the merge's silver changes, agrees.
    checkpoint = join(registry.root, "_checkpoints", registry.config.name, "gold")
    context = JobContext("gold", registry.config, registry, "available-now", 1_000, checkpoint)
    assert gold.run(spark, context) == 0
    assert engine_gold(spark, registry) == batch_gold(spark, registry)


def end_the_input(spark, registry: TableRegistry) -> None:
    """Flush silver, then let offline detection take the step: its last batch."""
    assert silver_job.flush(spark, registry)
    checkpoint = join(registry.root, "_checkpoints", registry.config.name, "offline")
    context = JobContext("offline", registry.config, registry, "available-now", 1_000, checkpoint)
    assert offline.run(spark, context) == 0


def detector_watermark(spark, registry: TableRegistry) -> int:
    state = spark.read.format("delta").load(registry.offline_state.path)
    return state.where("kind = 'clock'").first().ts_ms


def test_a_merge_landing_inside_a_detector_batch_leaves_the_status_events_of_a_batch_computation(
    spark, unflushed_fleet, tmp_path, monkeypatch
):
    pipeline, registry = copy_of(unflushed_fleet, tmp_path)
    assert statuses_of(spark, registry.late_tracks.path) == {"pending"}
    merged_inside = []

    def merge_between_events_and_state(step: str) -> None:
        if step == "offline:events" and not merged_inside:
            args = ["--pipeline", str(pipeline), "--lakehouse", registry.root]
            merged_inside.append(merge_late.main(args))

    monkeypatch.setattr(detector, "crash_point", merge_between_events_and_state)
    end_the_input(spark, registry)
    assert merged_inside == [0]
    assert statuses_of(spark, registry.late_tracks.path) == {"merged"}
    assert detector_watermark(spark, registry) == MAX_WATERMARK
    assert engine_status_events(spark, registry) == batch_status_events(spark, registry)
    assert_reconciles(spark, registry)


def test_the_offline_stream_folds_in_the_tracks_a_merge_claimed_and_a_crash_inside_is_repaired(
    spark, unflushed_fleet, tmp_path, monkeypatch
):
    _, registry = copy_of(unflushed_fleet, tmp_path)
    # A merge that claimed the late tracks and stopped, as one that left them to the stream.
    assert late_merge.claim_late_tracks(spark, registry, late_merge.TimeRange(), "run-a") > 0
    assert silver_job.flush(spark, registry)
    checkpoint = join(registry.root, "_checkpoints", registry.config.name, "offline")
    context = JobContext("offline", registry.config, registry, "available-now", 1_000, checkpoint)

    # The stream's next batch re-derives the claimed tracks' keys and dies before marking them.
    monkeypatch.setenv(CRASH_AFTER_VARIABLE, "offline:fold")
    monkeypatch.setenv(CRASH_BY_VARIABLE, "raise")
    assert offline.run(spark, context) == 1
    assert INJECTED_CRASHES[-1] == "offline:fold"
    assert statuses_of(spark, registry.late_tracks.path) == {"pending"}
    monkeypatch.delenv(CRASH_AFTER_VARIABLE)

    # Its restart replays the batch and folds them in: marked by the stream, not by a merge.
    assert offline.run(spark, context) == 0
    assert statuses_of(spark, registry.late_tracks.path) == {"merged"}
    labels = [
        row.userMetadata or ""
        for row in spark.sql(f"DESCRIBE HISTORY delta.`{registry.late_tracks.path}`").collect()
    ]
    assert any(label.startswith("tidemark-offline-fold:") for label in labels)
    assert engine_status_events(spark, registry) == batch_status_events(spark, registry)
    assert_reconciles(spark, registry)


def test_a_claim_is_found_by_its_run_id_however_many_commits_came_after_it(
    spark, unflushed_fleet, tmp_path, monkeypatch
):
    _, registry = copy_of(unflushed_fleet, tmp_path)
    monkeypatch.setattr(late_merge, "CLAIM_LOOKBACK", 2)
    path = registry.quarantine.path
    version = late_merge.claim(spark, registry, "run-a", late_merge.TimeRange())
    # Delta's own history is the oracle: the claim's commit carries the run id.
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`")
    assert version == history.where("userMetadata = 'tidemark-claim:run-a'").first().version
    # More commits after the claim than several looks at the log take (as silver's appends land).
    merged_row = (
        spark.read.format("delta")
        .load(path)
        .limit(1)
        .withColumn("status", F.lit("merged"))
        .withColumn("merge_run_id", F.lit(None).cast("string"))
    )
    appended = 3 * late_merge.CLAIM_LOOKBACK + 1
    for batch in range(appended):
        txn = Transaction(spark, path)
        txn.commit_append(txn.write(merged_row), f"append {batch}")
    assert table_version(spark, path) == version + appended
    assert late_merge.claim_version(spark, registry, "run-a") == version
    assert late_merge.claim_version(spark, registry, "run-b") is None


def telemetry_line(device: str, minute: int) -> str:
    record = {"device_id": device, "ts": START_MS + minute * 60_000 + 1000, "region": "east"}
    return json.dumps({**record, "battery": 50.0, "speed": 1.0, "partition": 0})


def test_a_device_a_merge_brings_back_online_inside_a_detector_batch_still_goes_offline_at_its_timeout(
    spark, tmp_path, monkeypatch
):
    # x sends at minutes 0 and 1 and goes offline at 31 (30-minute timeout); a late
    # track at 60 arrives at 72, while a keeps the watermark moving until 75. The merge
    # re-derives x inside the end of input's detector batch: x online since 60, and the
    # batch, which read x as offline and emitted nothing for it, must still give its
    # offline at 90.
    pipeline = write_pipeline(tmp_path)
    lines = [telemetry_line("a", minute) for minute in range(76)]
    lines[2:2] = [telemetry_line("x", 0), telemetry_line("x", 1)]
    lines.insert(lines.index(telemetry_line("a", 72)) + 1, telemetry_line("x", 60))
    source = tmp_path / "devices.json"
    source.write_text("\n".join(lines) + "\n")
    config = load_pipeline(pipeline)
    registry = TableRegistry(config, str(tmp_path / "lakehouse"))
    assert replay(spark, config, source, registry.root, batch_size=10) == 0
    assert statuses_of(spark, registry.late_tracks.path) == {"pending"}
    merged_inside = []

    def merge_between_events_and_state(step: str) -> None:
        if step == "offline:events" and not merged_inside:
            merged_inside.append(merge_late.main(["--pipeline", str(pipeline), "--lakehouse", registry.root]))

    monkeypatch.setattr(detector, "crash_point", merge_between_events_and_state)
    end_the_input(spark, registry)
    assert merged_inside == [0]
    events = engine_status_events(spark, registry)
    assert [event for event in events if event[0] == "x"] == [
        ("x", "offline", START_MS + 31 * 60_000 + 1000),
        ("x", "offline", START_MS + 90 * 60_000 + 1000),
        ("x", "online", START_MS + 60 * 60_000 + 1000),
    ]
    assert events == batch_status_events(spark, registry)
    assert_reconciles(spark, registry)


def test_a_detector_batch_landing_inside_a_re_derivation_neither_moves_the_clock_back_nor_changes_events(
    spark, unflushed_fleet, tmp_path, monkeypatch
):
    pipeline, registry = copy_of(unflushed_fleet, tmp_path)
    assert statuses_of(spark, registry.late_tracks.path) == {"pending"}
    replace_events = detector.replace_events
    detector_ran = []

    def detector_between_events_and_state(*args) -> None:
        replace_events(*args)
        if not detector_ran:
            detector_ran.append(True)
            end_the_input(spark, registry)

    monkeypatch.setattr(detector, "replace_events", detector_between_events_and_state)
    assert merge_late.main(["--pipeline", str(pipeline), "--lakehouse", registry.root]) == 0
    assert detector_ran
    # The batch inside saw the merge's claim and folded the claimed tracks in itself.
    labels = spark.sql(f"DESCRIBE HISTORY delta.`{registry.late_tracks.path}`").select("userMetadata")
    assert any((row.userMetadata or "").startswith("tidemark-offline-fold:") for row in labels.collect())
    assert statuses_of(spark, registry.late_tracks.path) == {"merged"}
    assert detector_watermark(spark, registry) == MAX_WATERMARK
    assert engine_status_events(spark, registry) == batch_status_events(spark, registry)
    assert_reconciles(spark, registry)


def test_a_re_derivation_landing_inside_another_of_the_same_keys_does_not_start_over(
    spark, unflushed_fleet, tmp_path, monkeypatch
):
    # The live detector re-derives the keys its batch touched while a merge re-derives
    # its late tracks' keys: at one clock both compute the same rows, so neither may
    # make the other start over (they did, in turn, until the merge gave up).
    pipeline, registry = copy_of(unflushed_fleet, tmp_path)
    replace_events = detector.replace_events
    merge_attempts, inside = [], []

    def another_re_derivation_between_events_and_state(spark, events_table, key, keys, fresh) -> None:
        replace_events(spark, events_table, key, keys, fresh)
        if inside:
            return
        merge_attempts.append(keys.count())
        if len(merge_attempts) == 1:
            inside.append(True)
            assert detector.rederive_keys(spark, registry, keys, datetime.now(UTC)) == keys.count()
            inside.clear()

    monkeypatch.setattr(detector, "replace_events", another_re_derivation_between_events_and_state)
    assert merge_late.main(["--pipeline", str(pipeline), "--lakehouse", registry.root]) == 0
    assert len(merge_attempts) == 1 and merge_attempts[0] > 0
    assert statuses_of(spark, registry.late_tracks.path) == {"merged"}
    end_the_input(spark, registry)
    assert engine_status_events(spark, registry) == batch_status_events(spark, registry)
    assert_reconciles(spark, registry)


def table_rows(spark, path: str) -> int:
    try:
        return spark.read.format("delta").load(path).count()
    except Exception:  # not created yet
        return 0


def silver_caught_up(spark, registry: TableRegistry) -> bool:
    """Silver's last clock commit (a history step with partition clocks) is at the
    last bronze version."""
    latest = spark.sql(f"DESCRIBE HISTORY delta.`{registry.bronze.path}` LIMIT 1").first().version
    judged = spark.sql(
        f"SELECT max(batch_id) FROM delta.`{registry.ops['watermark_history'].path}` "
        f"WHERE pipeline = '{registry.config.name}' AND partition_clocks IS NOT NULL"
    ).first()[0]
    return judged == latest


def stop_gracefully(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            kill_hard(process)
