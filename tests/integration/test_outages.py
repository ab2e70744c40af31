"""Outages of what a pipeline depends on, each followed by recovery with nothing lost
or doubled: the Kafka broker stopped for half a minute while bronze reads it, and the
object store under the lakehouse while bronze commits to it."""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

import pytest

from spark_jobs.generator import FleetSpec, Manifest, generate, malformed_kinds, send_to_kafka, write_landing
from spark_jobs.kafka_broker import KafkaBroker
from spark_jobs.submit import submit_env
from tests.integration.conftest import (
    assert_bronze_reconciles,
    delta_commits,
    job_command,
    kill_hard,
    registry_for,
    run_here,
    wait_for,
    write_pipeline,
)
from tests.integration.test_late_merge import assert_reconciles
from tests.integration.test_object_storage import objects_under

pytestmark = [pytest.mark.spark, pytest.mark.slow]

OUTAGE_S = 30
FLEET = FleetSpec(devices=8, partitions=4, seed=31, duration_ms=20 * 60_000, malformed_ratio=0.03)


def started(job: str, pipeline: Path, lakehouse: Path | str, log: Path, environment=None) -> subprocess.Popen:
    """spark-submit ``job`` continuous at 1-second triggers, its output in ``log``."""
    with log.open("w") as output:
        return subprocess.Popen(
            job_command(job, pipeline, lakehouse, "--trigger", "continuous", "--interval", "1s"),
            env={**submit_env(), **(environment or {})},
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def ingested(spark, registry) -> int:
    """Records bronze has taken in: its rows and its rejects."""
    rows = spark.read.format("delta").load(registry.bronze.path).count()
    return rows + spark.read.format("delta").load(registry.ops["rejects"].path).count()


def assert_judged_exactly(spark, pipeline: Path, lakehouse: Path | str, registry, generated) -> None:
    """Input = bronze + rejected, and silver, run over what bronze took in, judges each
    bronze record once: on time in a window or quarantined."""
    assert_bronze_reconciles(spark, registry, Manifest.of(generated), generated)
    assert run_here("silver", pipeline, lakehouse).returncode == 0
    assert_reconciles(spark, registry)


def test_bronze_rides_through_a_broker_stopped_for_half_a_minute_and_loses_and_doubles_nothing(
    spark, tmp_path
):
    # A broker of its own: the suite's is shared by the tests after this one.
    broker = KafkaBroker(tmp_path / "kafka").start()
    try:
        topic = "outage"
        broker.create_topic(topic, FLEET.partitions)
        source = {
            "kind": "kafka",
            "bootstrap_servers": broker.bootstrap_servers,
            "topic": topic,
            "max_offsets_per_trigger": 200,
        }
        pipeline, lakehouse = write_pipeline(tmp_path, source=source), tmp_path / "lakehouse"
        registry = registry_for(pipeline, lakehouse)
        generated = generate(FLEET, malformed_kinds("kafka"))
        half = len(generated) // 2
        send_to_kafka(generated[:half], broker.bootstrap_servers, topic)
        log = tmp_path / "bronze.log"
        bronze = started("bronze", pipeline, lakehouse, log)
        try:
            wait_for(lambda: delta_commits(registry.bronze.path) >= 3, 240, "bronze to commit a few batches")
            broker.stop()
            time.sleep(OUTAGE_S)
            assert bronze.poll() is None, f"bronze stopped with the broker down:\n{log.read_text()[-3000:]}"
            broker.start()
            send_to_kafka(generated[half:], broker.bootstrap_servers, topic)

            wait_for(
                lambda: ingested(spark, registry) >= len(generated), 300, "bronze to take in the rest", 2
            )
            assert bronze.poll() is None, log.read_text()[-3000:]
        finally:
            kill_hard(bronze)
    finally:
        broker.stop()
    assert_judged_exactly(spark, pipeline, lakehouse, registry, generated)


def test_bronze_rides_through_an_object_store_stopped_for_half_a_minute_mid_commits(
    spark, s3_server, tmp_path
):
    landing = tmp_path / "landing"
    source = {"kind": "files", "path": str(landing), "format": "json", "max_files_per_trigger": 1}
    pipeline = write_pipeline(tmp_path, source=source)
    lakehouse = f"s3a://{s3_server.bucket}/outage-{uuid.uuid4().hex}/lake"
    registry = registry_for(pipeline, lakehouse)
    generated = generate(FLEET, malformed_kinds("files"))
    files = write_landing(generated, landing, 60)
    log = tmp_path / "bronze.log"
    bronze = started("bronze", pipeline, lakehouse, log, s3_server.environment())
    bronze_log = registry.bronze.path.removeprefix("s3a://") + "/_delta_log"

    def bronze_commits() -> int:
        return sum(path.endswith(".json") for path in objects_under(s3_server, bronze_log))

    try:
        wait_for(lambda: bronze_commits() >= 3, 240, "bronze to commit a few batches")
        s3_server.stop()
        time.sleep(OUTAGE_S)
        s3_server.start()
        # A file a trigger: the store went away with files still to commit.
        assert bronze_commits() < len(files)
        assert bronze.poll() is None, f"bronze stopped with the store down:\n{log.read_text()[-3000:]}"
        wait_for(lambda: ingested(spark, registry) >= len(generated), 300, "bronze to take in the rest", 2)
        assert bronze.poll() is None, log.read_text()[-3000:]
    finally:
        kill_hard(bronze)
        if s3_server.process.poll() is not None:  # the suite's store, for the tests after this one
            s3_server.start()
    assert_judged_exactly(spark, pipeline, lakehouse, registry, generated)
