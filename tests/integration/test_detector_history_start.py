"""Where a new offline query starts reading ``ops.watermark_history``: a young
history of appends commit by commit from its first (no snapshot's Spark jobs),
any other from a snapshot, so that a history compacted and vacuumed still starts."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from spark_jobs.lakehouse.create import create_missing
from spark_jobs.lakehouse.log import readable_from_first_commit
from spark_jobs.lakehouse.writes import session_settings
from spark_jobs.tables import TableRegistry, join
from tests.integration.engine import (
    BASE_MS,
    BOUNDED,
    OFFLINE,
    TUMBLING,
    assert_reconciles,
    batch_computation,
    engine_config,
    payload,
    replay_batches,
    run_job_once,
)

pytestmark = pytest.mark.spark


def appended_table(spark, path: Path, appends: int) -> str:
    """A table created empty (version 0, as Tidemark creates its tables), then ``appends`` appends."""
    spark.createDataFrame([], "step long").write.format("delta").save(str(path))
    for step in range(appends):
        spark.createDataFrame([(step,)], "step long").write.format("delta").mode("append").save(str(path))
    return str(path)


def test_a_table_of_appends_is_readable_from_its_first_commit(spark, tmp_path):
    assert readable_from_first_commit(spark, appended_table(spark, tmp_path / "t", 3), most=3)


def test_a_table_with_more_commits_than_the_bound_is_not(spark, tmp_path):
    assert not readable_from_first_commit(spark, appended_table(spark, tmp_path / "t", 3), most=2)


def test_a_compacted_table_is_not(spark, tmp_path):
    path = appended_table(spark, tmp_path / "t", 3)
    spark.sql(f"OPTIMIZE delta.`{path}`").collect()
    assert not readable_from_first_commit(spark, path, most=100)


def test_a_table_whose_schema_changed_after_its_creation_is_not(spark, tmp_path):
    path = appended_table(spark, tmp_path / "t", 1)
    wider = spark.createDataFrame([(9, "x")], "step long, note string")
    wider.write.format("delta").mode("append").option("mergeSchema", "true").save(path)
    assert not readable_from_first_commit(spark, path, most=100)


def test_a_table_whose_first_commit_left_its_log_is_not(spark, tmp_path):
    path = appended_table(spark, tmp_path / "t", 2)
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.checkpointInterval' = '1')")
    spark.createDataFrame([(7,)], "step long").write.format("delta").mode("append").save(path)
    log = tmp_path / "t" / "_delta_log"
    assert list(log.glob("*.checkpoint.parquet")), "the log must be readable without its first commit"
    (log / f"{0:020d}.json").unlink()
    assert spark.read.format("delta").load(path).count() == 3
    assert not readable_from_first_commit(spark, path, most=100)


def status_events(spark, registry: TableRegistry) -> list[tuple]:
    rows = spark.read.format("delta").load(registry.status_events.path).collect()
    return sorted((row.device_id, row.status, row.event_time, row.watermark) for row in rows)


def test_a_new_detector_over_a_compacted_and_vacuumed_history_gives_the_replays_status_events(
    spark, tmp_path
):
    timeout_ms = 30 * 60_000
    tracks = [("scooter-1", BASE_MS + s * 1000) for s in (15, 20, 25, 40 * 60)] + [
        ("scooter-2", BASE_MS + s * 1000) for s in (30, 90, 70 * 60)
    ]
    in_time_order = sorted(tracks, key=lambda track: track[1])
    records = [payload(0, ts, device, 80.0, 10.0) for device, ts in in_time_order]
    batches = [records[:2], records[2:4], records[4:6], records[6:]]
    registry = replay_batches(
        spark, engine_config(TUMBLING, BOUNDED, offline=OFFLINE), tmp_path, batches, flush=True
    )
    assert_reconciles(spark, registry, records)
    replayed = status_events(spark, registry)
    assert sorted((device, status, int(at.timestamp() * 1000)) for device, status, at, _ in replayed) == (
        batch_computation(tracks, timeout_ms)
    )

    history = registry.ops["watermark_history"].path
    spark.sql(f"OPTIMIZE delta.`{history}`").collect()
    # Files compacted away deleted at once; the listing in a few tasks, as `tidemark maintenance` does.
    vacuum_now = {
        "spark.databricks.delta.retentionDurationCheck.enabled": "false",
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": "8",
    }
    with session_settings(spark, vacuum_now):
        spark.sql(f"VACUUM delta.`{history}` RETAIN 0 HOURS").collect()
    assert not readable_from_first_commit(spark, history, most=100)
    # A new detector: its checkpoint, state and outputs gone, the rest of the lakehouse kept.
    shutil.rmtree(join(registry.root, "_checkpoints", registry.config.name, "offline"))
    for table in (registry.offline_state, registry.status_events, registry.late_tracks):
        shutil.rmtree(table.path)
    create_missing(spark, registry)

    assert run_job_once(spark, registry, "offline") == 0
    assert status_events(spark, registry) == replayed
