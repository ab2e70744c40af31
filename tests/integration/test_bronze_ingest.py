"""Bronze against real components: spark-submit, files on disk, a real Kafka broker."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from pyspark.sql import functions as F

from spark_jobs.cli import main as tidemark
from spark_jobs.engine import clocks
from spark_jobs.engine.clocks import backlog_beyond
from spark_jobs.generator import FleetSpec, Manifest, generate, malformed_kinds, send_to_kafka, write_landing
from spark_jobs.lakehouse.log import commits, table_version
from spark_jobs.sources.progress import written_partitions
from tests.integration.conftest import (
    assert_bronze_reconciles,
    delta_commits,
    registry_for,
    run_here,
    run_job,
    write_pipeline,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

FLEET = FleetSpec(
    devices=40, partitions=4, seed=7, duration_ms=20 * 60_000, late_ratio=0.01, malformed_ratio=0.03
)


def land(tmp_path: Path, file_format: str = "json", spec: FleetSpec = FLEET, per_file: int = 400, **source):
    lakehouse = tmp_path / "lakehouse"
    landing = tmp_path / "landing"
    pipeline = write_pipeline(
        tmp_path, source={"kind": "files", "path": str(landing), "format": file_format, **source}
    )
    generated = generate(spec, malformed_kinds("files"))
    files = write_landing(generated, landing, per_file, file_format)
    return pipeline, lakehouse, generated, Manifest.of(generated), files


def source_of(pipeline: Path) -> dict:
    return yaml.safe_load(pipeline.read_text())["source"]


def test_json_landing_zone_reconciles_exactly_through_spark_submit(spark, tmp_path):
    pipeline, lakehouse, generated, manifest, files = land(tmp_path)
    assert set(manifest.rejected) == set(malformed_kinds("files"))  # every reason is exercised

    run_job("bronze", pipeline, lakehouse)

    registry = registry_for(pipeline, lakehouse)
    assert_bronze_reconciles(spark, registry, manifest, generated)
    bronze = spark.read.format("delta").load(registry.bronze.path)
    # ingest_time is the file's arrival; source_offset its line number.
    first = files[0]
    arrived = datetime.fromtimestamp(os.stat(first).st_mtime, UTC).replace(tzinfo=None)
    rows = (
        bronze.where(bronze.source_file.endswith(Path(first).name))
        .select("ingest_time", "source_offset")
        .collect()
    )
    rejects = spark.read.format("delta").load(registry.ops["rejects"].path)
    rejected_lines = [
        r.source_offset for r in rejects.where(rejects.source_file.endswith(Path(first).name)).collect()
    ]
    assert sorted([r.source_offset for r in rows] + rejected_lines) == list(range(1, 401))
    assert {abs((r.ingest_time - arrived).total_seconds()) < 0.002 for r in rows} == {True}
    runs = spark.read.format("delta").load(registry.ops["runs"].path).where("status = 'succeeded'").collect()
    assert [(r.job, r.rows_in, r.rows_out, r.rejected) for r in runs] == [
        ("bronze", manifest.records, manifest.valid, manifest.records - manifest.valid)
    ]
    # File statistics on the times alone: the key's and the partition's bounds in a
    # file of one micro-batch span them all, and would cost a string copy a row.
    assert bronze_statistics(registry.bronze.path) == {("event_time", "ingest_time")}


def bronze_statistics(table_path: str) -> set[tuple[str, ...]]:
    """The columns each data file of the table has bounds for, as its Delta log says."""
    added = [
        json.loads(line)["add"]
        for commit in sorted((Path(table_path) / "_delta_log").glob("*.json"))
        for line in commit.read_text().splitlines()
        if '"add"' in line
    ]
    assert added
    return {tuple(sorted(json.loads(add["stats"])["minValues"])) for add in added}


def test_csv_landing_zone_reconciles_exactly_through_the_cli(spark, tmp_path):
    pipeline, lakehouse, generated, manifest, _ = land(
        tmp_path, "csv", FleetSpec(devices=12, seed=3, duration_ms=600_000, malformed_ratio=0.05)
    )

    assert (
        tidemark(
            [
                "bronze",
                "--pipeline",
                str(pipeline),
                "--lakehouse",
                str(lakehouse),
                "--trigger",
                "available-now",
            ]
        )
        == 0
    )

    assert_bronze_reconciles(spark, registry_for(pipeline, lakehouse), manifest, generated)


def test_a_replayed_micro_batch_writes_nothing_twice(spark, tmp_path):
    """A crash after the Delta writes but before the checkpoint commit replays the
    batch: Delta's txnAppId/txnVersion make the replay a no-op."""
    pipeline, lakehouse, generated, manifest, _ = land(tmp_path, max_files_per_trigger=2)
    assert run_here("bronze", pipeline, lakehouse).returncode == 0
    registry = registry_for(pipeline, lakehouse)
    commits = Path(lakehouse, "_checkpoints", registry.config.name, "bronze", "commits")
    last = max(commits.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
    last.unlink()  # the batch ran and wrote, but "crashed" before committing
    last.with_name(f".{last.name}.crc").unlink(missing_ok=True)
    versions = delta_commits(registry.bronze.path)

    assert run_here("bronze", pipeline, lakehouse).returncode == 0

    runs = (
        spark.read.format("delta")
        .load(registry.ops["runs"].path)
        .where("status = 'succeeded'")
        .orderBy("started_at")
    )
    replay = runs.collect()[-1]
    assert replay.batches == 1 and replay.rows_in > 0  # the batch really ran again
    assert delta_commits(registry.bronze.path) == versions  # and Delta skipped its writes
    assert_bronze_reconciles(spark, registry, manifest, generated)


def test_each_commit_names_the_partitions_of_its_records_and_silver_reads_its_backlog_from_them(
    spark, tmp_path, monkeypatch
):
    spec = FleetSpec(devices=6, partitions=3, seed=11, duration_ms=2 * 60_000, malformed_ratio=0.05)
    pipeline, lakehouse, generated, manifest, _ = land(
        tmp_path, spec=spec, per_file=5, max_files_per_trigger=1
    )
    assert run_here("bronze", pipeline, lakehouse).returncode == 0
    registry = registry_for(pipeline, lakehouse)
    assert_bronze_reconciles(spark, registry, manifest, generated)

    feed = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 1)
    in_feed: dict[int, set[str]] = {}
    for row in feed.load(registry.bronze.path).select("_commit_version", "source_partition").collect():
        in_feed.setdefault(row._commit_version, set()).add(row.source_partition)
    latest = table_version(spark, registry.bronze.path)
    labels = {
        c.version: written_partitions(c.user_metadata)
        for c in commits(spark, registry.bronze.path, 1, latest)
    }
    assert len(labels) > 3 and len({frozenset(p) for p in in_feed.values()}) > 1  # batches differ
    assert labels == {version: frozenset(in_feed.get(version, ())) for version in labels}
    # Read from the labels: the change feed is not touched.
    monkeypatch.setattr(clocks, "change_feed", lambda *args, **kwargs: pytest.fail("read the change feed"))
    read = []
    log = clocks.commits

    def counted(spark, path, start, end):
        found = log(spark, path, start, end)
        read.extend(commit.version for commit in found)
        return found

    monkeypatch.setattr(clocks, "commits", counted)
    for last in range(1, latest):
        beyond = set().union(*(in_feed.get(version, set()) for version in range(last + 1, latest + 1)))
        assert backlog_beyond(spark, registry, last, latest) == beyond
    # A catch-up in many triggers reads each version's label once, not once a trigger.
    assert sorted(read) == list(range(2, latest + 1))


def test_kafka_topic_reconciles_exactly_and_keeps_kafka_coordinates(spark, tmp_path, kafka_broker):
    topic = "telemetry_e2e"
    kafka_broker.create_topic(topic, 4)
    pipeline = write_pipeline(
        tmp_path,
        source={"kind": "kafka", "bootstrap_servers": kafka_broker.bootstrap_servers, "topic": topic},
    )
    lakehouse = tmp_path / "lakehouse"
    generated = generate(FLEET, malformed_kinds("kafka"))
    manifest = Manifest.of(generated)
    send_to_kafka(generated, kafka_broker.bootstrap_servers, topic)

    run_job("bronze", pipeline, lakehouse)

    registry = registry_for(pipeline, lakehouse)
    assert_bronze_reconciles(spark, registry, manifest, generated)
    bronze = spark.read.format("delta").load(registry.bronze.path)
    rejects = spark.read.format("delta").load(registry.ops["rejects"].path)
    both = bronze.select("source_partition", "source_offset").union(
        rejects.select("source_partition", "source_offset")
    )
    offsets = both.groupBy("source_partition").agg(
        F.count("*").alias("n"), F.min("source_offset").alias("lo"), F.max("source_offset").alias("hi")
    )
    # Every Kafka offset of every partition is accounted for, once.
    assert {r.source_partition: (r.n, r.lo, r.hi) for r in offsets.collect()} == {
        str(p): (n, 0, n - 1) for p, n in manifest.per_partition.items()
    }


def landed_names(folder: Path) -> set[str]:
    return {path.name for path in folder.rglob("*.json")} if folder.exists() else set()


@pytest.mark.parametrize("landed", ["archive", "delete"])
def test_landed_files_bronze_committed_leave_the_landing_folder_and_nothing_is_read_twice(
    spark, tmp_path, landed
):
    landing, archive, lakehouse = tmp_path / "landing", tmp_path / "archive", tmp_path / "lakehouse"
    extra = {"archive_path": str(archive)} if landed == "archive" else {}
    source = {"kind": "files", "path": str(landing), "format": "json", "landed_files": landed, **extra}
    pipeline = write_pipeline(tmp_path, source=source)
    spec = FleetSpec(devices=8, partitions=3, seed=13, duration_ms=10 * 60_000, malformed_ratio=0.03)
    generated = generate(spec, malformed_kinds("files"))
    half = len(generated) // 2
    first = {Path(path).name for path in write_landing(generated[:half], landing, 50)}
    assert run_here("bronze", pipeline, lakehouse).returncode == 0
    write_landing(generated[half:], landing, 50, prefix="second")
    assert run_here("bronze", pipeline, lakehouse).returncode == 0

    assert_bronze_reconciles(spark, registry_for(pipeline, lakehouse), Manifest.of(generated), generated)
    # The first run's files were committed before the second ran: gone from the landing folder.
    assert not first & landed_names(landing)
    if landed == "archive":
        assert first <= landed_names(archive)
    else:
        assert not archive.exists()
