"""Silver on real Spark and Delta: deterministic replay at any batching and skew
(against Spark's own watermark, which drops), idleness, and idempotent batches."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from spark_jobs.engine import clocks, watermark_steps
from spark_jobs.eventtime.clock import MAX_WATERMARK
from spark_jobs.generator import FleetSpec, generate, land_files
from spark_jobs.jobs.common import JobContext, default_checkpoint
from spark_jobs.jobs.silver import SilverBatchWriter
from spark_jobs.lakehouse.checkpoints import stream_app_id
from spark_jobs.lakehouse.create import create_missing
from spark_jobs.lakehouse.log import table_version
from spark_jobs.lakehouse.runs import RunTotals
from spark_jobs.tables import TableRegistry, join
from tests.integration.engine import (
    BASE_MS,
    assert_reconciles,
    engine_config,
    engine_history,
    engine_windows,
    payload,
    replay_batches,
    rounded,
    run_jobs,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TUMBLING = {"type": "tumbling", "size": "1m", "offset": "0s"}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("silver-engine")


def chunks(records: list[dict], size: int) -> list[list[dict]]:
    return [records[start : start + size] for start in range(0, len(records), size)]


def test_replays_at_any_batching_and_skew_give_identical_silver_and_no_quarantine(spark, root):
    fleet = generate(
        FleetSpec(devices=6, partitions=3, seed=3, duration_ms=300_000, bound_ms=5_000, offline_ratio=0.0)
    )
    records = [g.payload for g in fleet]
    by_partition = [[r for r in records if r["partition"] == p] for p in range(3)]
    # The slow partition (0) is read only after the others have been read entirely.
    skewed = by_partition[1] + by_partition[2] + by_partition[0]
    orders = {
        "interleaved, small batches": chunks(records, 12),
        "large batches": chunks(records, 100),
        "one partition far behind": chunks(skewed, 20),
    }
    watermark = {"strategy": "bounded", "max_out_of_orderness": "5s"}
    silvers = {}
    for name, batches in orders.items():
        config = engine_config(TUMBLING, watermark, "0s")
        registry = replay_batches(spark, config, root, batches, flush=True)
        silvers[name] = rounded(engine_windows(spark, registry))
        quarantined = spark.read.format("delta").load(registry.quarantine.path).count()
        assert quarantined == 0, f"{name}: {quarantined} pairs quarantined"
        assert_reconciles(spark, registry, records)
        if name == "one partition far behind":
            skewed_bronze = registry.bronze.path

    first = silvers["interleaved, small batches"]
    assert len(first) == len({(r["device_id"], r["ts"] // 60_000) for r in records})
    assert all(revision == 1 and status == "closed" for _, _, revision, status in first.values())
    for name, windows in silvers.items():
        assert windows == first, f"{name} differs from the interleaved replay"

    # The contrast: Spark's single global watermark over the same skewed bronze
    # commits, one commit per micro-batch, silently drops the slow partition.
    query = (
        spark.readStream.format("delta")
        .option("maxFilesPerTrigger", 1)
        .load(skewed_bronze)
        .withWatermark("event_time", "5 seconds")
        .groupBy(F.window("event_time", "1 minute"), "region", "device_id")
        .count()
        .writeStream.format("memory")
        .queryName("native_skewed")
        .outputMode("append")
        .trigger(availableNow=True)
        .option("checkpointLocation", str(root / "native-checkpoint"))
        .start()
    )
    query.awaitTermination()
    dropped = sum(
        operator.get("numRowsDroppedByWatermark", 0)
        for progress in query.recentProgress
        for operator in progress.get("stateOperators", [])
    )
    print(f"\nnative withWatermark + window dropped {dropped} of {len(records)} records; Tidemark dropped 0")
    assert dropped > 0


def test_an_idle_partition_stops_holding_the_watermark_back(spark, root):
    config = engine_config(TUMBLING, {"strategy": "bounded", "max_out_of_orderness": "0s", "idleness": "1ms"})
    quiet = [payload(1, BASE_MS + 1_000, "q1", 50.0, 1.0)]
    busy = [[payload(0, BASE_MS + minute * 60_000 + 5_000, "b1", 50.0, 1.0)] for minute in range(4)]
    batches = [busy[0] + quiet, *busy[1:]]
    registry = replay_batches(spark, config, root, batches)

    history = engine_history(spark, registry)
    busy_watermarks = [BASE_MS + minute * 60_000 + 5_000 - 1 for minute in range(4)]
    assert [entry[0] for entry in history] == [BASE_MS + 1_000 - 1, *busy_watermarks[1:]]
    assert [entry[2] for entry in history] == [0, 1, 1, 1]  # idle partitions
    fired = {window for window, (_, _, revision, _) in engine_windows(spark, registry).items() if revision}
    assert {start for (_, (start, _)) in fired} == {BASE_MS, BASE_MS + 60_000, BASE_MS + 120_000}
    assert_reconciles(spark, registry, [r for batch in batches for r in batch])


def test_a_slow_partition_with_a_backlog_is_never_idle(spark, root):
    config = engine_config(TUMBLING, {"strategy": "bounded", "max_out_of_orderness": "0s", "idleness": "1ms"})
    slow = [payload(1, BASE_MS + 1_000, "s1", 50.0, 1.0)]
    straggler = [payload(1, BASE_MS + 2_000, "s1", 50.0, 1.0)]
    busy = [[payload(0, BASE_MS + minute * 60_000 + 5_000, "b1", 50.0, 1.0)] for minute in range(4)]
    batches = [busy[0] + slow, busy[1], busy[2], busy[3] + straggler]
    registry = replay_batches(spark, config, root, batches)

    history = engine_history(spark, registry)
    assert [entry[2] for entry in history] == [0, 0, 0, 0]
    assert [entry[0] for entry in history] == [BASE_MS + 1_000 - 1] * 3 + [BASE_MS + 2_000 - 1]
    assert all(revision == 0 for _, _, revision, _ in engine_windows(spark, registry).values())
    assert_reconciles(spark, registry, [r for batch in batches for r in batch])


def snapshot(spark, registry) -> dict[str, list]:
    """Every table a silver batch writes, as sorted rows (timestamps of the write excluded)."""
    tables = {
        "silver": (registry.silver.path, ["updated_at"]),
        "quarantine": (registry.quarantine.path, ["quarantined_at"]),
        "history": (registry.ops["watermark_history"].path, []),
        "watermarks": (registry.ops["watermarks"].path, ["updated_at"]),
    }
    return {
        name: sorted(map(str, spark.read.format("delta").load(path).drop(*excluded).collect()))
        for name, (path, excluded) in tables.items()
    }


def replay_last_batch(spark, config, registry, batch_id_offset: int) -> None:
    """Run silver's batch writer again on the newest bronze version, as Spark does
    after a crash between the batch's writes and its checkpoint commit."""
    checkpoint = join(registry.root, "_checkpoints", config.name, "silver")
    committed = max(int(p.name) for p in Path(checkpoint, "commits").iterdir() if p.name.isdigit())
    changes = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 0)
        .load(registry.bronze.path)
    )
    last_commit = changes.agg(F.max("_commit_version")).first()[0]
    last_batch = (
        changes.where(F.col("_commit_version") == last_commit)
        .withColumnRenamed("_commit_version", "version")
        .drop("_change_type", "_commit_timestamp")
    )
    context = JobContext("silver", config, registry, "available-now", 1_000, checkpoint)
    SilverBatchWriter(spark, context, RunTotals())(last_batch, committed + batch_id_offset)


def test_replaying_a_committed_silver_batch_changes_nothing(spark, root):
    config = engine_config(TUMBLING, {"strategy": "bounded", "max_out_of_orderness": "0s"}, "0s")
    batches = [
        [payload(0, BASE_MS + 5_000, "d1", 60.0, 3.0)],
        [payload(0, BASE_MS + 70_000, "d1", 50.0, 2.0)],
        [payload(0, BASE_MS + 1_000, "d1", 40.0, 1.0)],  # its window is cleaned: quarantined
    ]
    registry = replay_batches(spark, config, root, batches)
    before = snapshot(spark, registry)
    assert len(before["quarantine"]) == 1

    replay_last_batch(spark, config, registry, 0)  # a crash after the commit: the same batch id again
    assert snapshot(spark, registry) == before

    replay_last_batch(spark, config, registry, 1)  # judged bronze versions, whatever the batch id
    assert snapshot(spark, registry) == before


def test_replaying_a_batch_that_had_no_late_records_quarantines_nothing(spark, root):
    # One batch spanning three minutes: all on time against the watermark before it,
    # but its first record's window is long cleaned by the watermark after it.
    config = engine_config(TUMBLING, {"strategy": "bounded", "max_out_of_orderness": "0s"}, "0s")
    batch = [payload(0, BASE_MS + 5_000, "d1", 60.0, 3.0), payload(0, BASE_MS + 180_000, "d1", 50.0, 2.0)]
    registry = replay_batches(spark, config, root, [batch])
    before = snapshot(spark, registry)
    assert before["quarantine"] == []

    replay_last_batch(spark, config, registry, 0)
    assert snapshot(spark, registry) == before
    assert_reconciles(spark, registry, batch)


def test_a_silver_stream_judges_its_next_batch_by_an_idleness_step_taken_between_its_runs(spark, root):
    # The stream keeps its clock in memory between runs; the step is another writer's.
    config = engine_config(TUMBLING, {"strategy": "bounded", "max_out_of_orderness": "0s", "idleness": "1ms"})
    registry = TableRegistry(config, str(root / config.name))
    first = [payload(0, BASE_MS + 5 * 60_000, "a", 50.0, 1.0), payload(1, BASE_MS + 1_000, "b", 50.0, 1.0)]
    # On time against the first batch's watermark (1 s), late once both partitions are idle.
    second = [payload(0, BASE_MS + 2 * 60_000, "a", 50.0, 1.0)]
    land_files([[json.dumps(record) for record in first]], registry.landing_path, "json")
    run_jobs(spark, registry, "bronze", "silver")
    step = watermark_steps.advance_idle(spark, registry, datetime.now(UTC))
    assert step is not None and step.watermark_after == BASE_MS + 5 * 60_000 - 1
    land_files([[json.dumps(record) for record in second]], registry.landing_path, "json")
    run_jobs(spark, registry, "bronze", "silver")

    quarantined = spark.read.format("delta").load(registry.quarantine.path).collect()
    assert [(row.device_id, row.watermark) for row in quarantined] == [("a", BASE_MS + 5 * 60_000 - 1)]
    assert_reconciles(spark, registry, first + second)


def bronze_version(spark, registry: TableRegistry, version: int):
    """Bronze's inserts of one version, as silver's stream hands them to its writer."""
    changes = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", version)
        .option("endingVersion", version)
        .load(registry.bronze.path)
    )
    return changes.withColumnRenamed("_commit_version", "version").drop("_change_type", "_commit_timestamp")


def test_a_silver_batch_commits_its_clocks_with_its_history_and_the_snapshot_waits_for_the_run_end(
    spark, root
):
    config = engine_config(TUMBLING, {"strategy": "bounded", "max_out_of_orderness": "0s"})
    registry = TableRegistry(config, str(root / config.name))
    batches = [
        [payload(partition, BASE_MS + minute * 60_000, "d1", 50.0, 1.0)]
        for minute, partition in ((1, 0), (2, 1), (3, 0))
    ]
    create_missing(spark, registry)
    checkpoint = root / config.name / "silver-checkpoint"
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text('{"id":"silver-writer"}')
    writer = SilverBatchWriter(
        spark, JobContext("silver", config, registry, "continuous", 1_000, str(checkpoint)), RunTotals()
    )
    clocks, history = registry.ops["watermarks"].path, registry.ops["watermark_history"].path
    snapshot_commits = table_version(spark, clocks)
    # A stream that keeps up: each bronze version (1-3) is silver's next batch.
    for batch_id, records in enumerate(batches):
        land_files([[json.dumps(record) for record in records]], registry.landing_path, "json")
        run_jobs(spark, registry, "bronze")
        writer(bronze_version(spark, registry, batch_id + 1), batch_id)
        assert table_version(spark, clocks) == snapshot_commits, "a batch wrote the snapshot"
    steps = spark.read.format("delta").load(history).orderBy("batch_id").collect()
    assert [(step.batch_id, step.watermark) for step in steps] == [
        (version, BASE_MS + minute * 60_000 - 1) for version, minute in ((1, 1), (2, 1), (3, 2))
    ]
    # Each step carries the clocks after it; partition 1 is known from its first record on.
    assert [
        [(c.source_partition, c.partition_watermark) for c in step.partition_clocks] for step in steps
    ] == [
        [("0", BASE_MS + 60_000 - 1)],
        [("0", BASE_MS + 60_000 - 1), ("1", BASE_MS + 120_000 - 1)],
        [("0", BASE_MS + 180_000 - 1), ("1", BASE_MS + 120_000 - 1)],
    ]

    writer.close()
    assert table_version(spark, clocks) == snapshot_commits + 1
    snapshot = spark.read.format("delta").load(clocks).where(F.col("pipeline") == config.name)
    assert sorted(
        (row.source_partition, row.partition_watermark, row.batch_id) for row in snapshot.collect()
    ) == [
        ("0", BASE_MS + 180_000 - 1, 3),
        ("1", BASE_MS + 120_000 - 1, 3),
    ]
    assert_reconciles(spark, registry, [record for records in batches for record in records])


def silver_file_actions(registry: TableRegistry, operation: str) -> tuple[list[str], list[str]]:
    """(added, removed) data file paths of silver's ``operation`` commits, from its log."""
    added, removed = [], []
    for commit in sorted(Path(registry.silver.path, "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in commit.read_text().splitlines()]
        if any(action.get("commitInfo", {}).get("operation") == operation for action in actions):
            added += [action["add"]["path"] for action in actions if "add" in action]
            removed += [action["remove"]["path"] for action in actions if "remove" in action]
    return added, removed


def test_a_micro_batch_never_reads_or_rewrites_the_closed_windows(spark, root):
    # A minute apart, in one partition: each batch closes the windows of the one before.
    records = [payload(0, BASE_MS + minute * 60_000 + 10_000, "d1", 50.0, 1.0) for minute in range(5)]
    config = engine_config(TUMBLING, {"strategy": "bounded", "max_out_of_orderness": "5s"}, "0s")
    registry = replay_batches(spark, config, root, [[record] for record in records], silver_every_batch=True)
    added, removed = silver_file_actions(registry, "WRITE")
    closed = [path for path in added if path.startswith("status=closed/")]
    assert len(closed) == 4  # the first four windows, closed one batch after another
    assert not [path for path in removed if path.startswith("status=closed/")]
    windows = engine_windows(spark, registry)
    assert [status for *_, status in windows.values()].count("closed") == 4
    assert_reconciles(spark, registry, records)


def test_a_silver_batch_replaces_its_own_pipelines_clocks_and_no_other_pipelines(spark, root):
    watermark = {"strategy": "bounded", "max_out_of_orderness": "0s"}
    first, second = (engine_config(TUMBLING, watermark) for _ in range(2))
    first_records = [payload(0, BASE_MS + 1_000, "d1", 1.0, 1.0)]
    second_batches = [
        [payload(0, BASE_MS + 2_000, "d1", 1.0, 1.0)],
        [payload(1, BASE_MS + 5_000, "d2", 1.0, 1.0)],
    ]
    first_registry = replay_batches(spark, first, root, [first_records])
    registry = replay_batches(spark, second, root, second_batches, silver_every_batch=True)
    assert_reconciles(spark, first_registry, first_records)
    assert_reconciles(spark, registry, [record for batch in second_batches for record in batch])
    clocks = spark.read.format("delta").load(registry.ops["watermarks"].path)
    rows = {
        (row.pipeline, row.source_partition): row.partition_watermark
        for row in clocks.where(F.col("pipeline").isin(first.name, second.name)).collect()
    }
    # Declared by the replay's source from its first batch on, both partitions of the
    # second pipeline have one row each, at the watermark of their own records.
    assert rows == {
        (first.name, "0"): BASE_MS + 1_000 - 1,
        (second.name, "0"): BASE_MS + 2_000 - 1,
        (second.name, "1"): BASE_MS + 5_000 - 1,
    }


def loads_counted(monkeypatch) -> list[str]:
    """Every read of the pipeline clock back from its tables, from now on."""
    loads: list[str] = []
    original = clocks.load_clock

    def counted(spark, registry):
        loads.append(registry.config.name)
        return original(spark, registry)

    monkeypatch.setattr(clocks, "load_clock", counted)
    monkeypatch.setattr(watermark_steps, "load_clock", counted)
    return loads


def new_folder(root: Path, name: str) -> Path:
    folder = root / name
    folder.mkdir()
    return folder


def flushed_tables(spark, registry: TableRegistry) -> tuple[list, list]:
    windows = (
        spark.read.format("delta").load(registry.silver.path).drop("updated_at", "fired_at", "closed_at")
    )
    return sorted(map(tuple, windows.collect())), engine_history(spark, registry)


FLUSH_BATCHES = [
    [payload(0, BASE_MS + 1_000, "a", 50.0, 1.0), payload(1, BASE_MS + 2_000, "b", 40.0, 2.0)],
    [payload(0, BASE_MS + 70_000, "a", 30.0, 3.0), payload(1, BASE_MS + 65_000, "b", 20.0, 4.0)],
]
FLUSH_RECORDS = [record for batch in FLUSH_BATCHES for record in batch]


def test_a_flush_after_the_silver_stream_in_the_same_process_takes_its_clock_from_memory(
    spark, root, monkeypatch
):
    config = engine_config(TUMBLING, {"strategy": "bounded", "max_out_of_orderness": "5s"})
    remembered, read_back = (
        replay_batches(spark, config, new_folder(root, name), FLUSH_BATCHES)
        for name in ("flush-from-memory", "flush-read-back")
    )
    checkpoint = default_checkpoint(remembered, "silver")
    loads = loads_counted(monkeypatch)

    assert watermark_steps.flush(spark, remembered, after_stream=checkpoint)
    assert loads == []
    # Without the stream's memory (as in a new process) the flush reads the clock back, and writes the same.
    assert watermark_steps.flush(spark, read_back)
    assert loads == [config.name]
    assert flushed_tables(spark, remembered) == flushed_tables(spark, read_back)
    assert_reconciles(spark, remembered, FLUSH_RECORDS)
    # The flush moved the tracker it took: the stream's next batch reads its clock back.
    app_id = stream_app_id(spark, checkpoint)
    assert clocks.clock_memory(app_id, remembered).saved is None


def test_a_flush_after_another_writers_clock_step_reads_the_clock_back(spark, root, monkeypatch):
    config = engine_config(TUMBLING, {"strategy": "bounded", "max_out_of_orderness": "5s", "idleness": "1ms"})
    registry = replay_batches(spark, config, new_folder(root, "flush-after-idle-step"), FLUSH_BATCHES)
    step = watermark_steps.advance_idle(spark, registry, datetime.now(UTC))
    assert step is not None
    loads = loads_counted(monkeypatch)

    assert watermark_steps.flush(spark, registry, after_stream=default_checkpoint(registry, "silver"))
    # The idleness step's commit outdated the stream's memory: the end of input follows
    # that step, with both partitions idle as it left them (the memory had them active).
    assert len(loads) == 1
    assert engine_history(spark, registry)[-2:] == [
        (step.watermark_after, 0, 2, 0, 0),
        (MAX_WATERMARK, 0, 2, 0, 0),
    ]
    assert_reconciles(spark, registry, FLUSH_RECORDS)
