"""Outages of what a pipeline depends on, each followed by recovery with nothing lost
or doubled: the Kafka broker stopped for half a minute while bronze reads it."""

from __future__ import annotations

import subprocess
import time

import pytest

from spark_jobs.generator import FleetSpec, Manifest, generate, malformed_kinds, send_to_kafka
from spark_jobs.kafka_broker import KafkaBroker
from spark_jobs.submit import submit_env
from tests.integration.conftest import (
    assert_bronze_reconciles,
    delta_commits,
    job_command,
    kill_hard,
    registry_for,
    wait_for,
    write_pipeline,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

OUTAGE_S = 30
FLEET = FleetSpec(devices=8, partitions=4, seed=31, duration_ms=20 * 60_000, malformed_ratio=0.03)


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
        with log.open("w") as output:
            bronze = subprocess.Popen(
                job_command("bronze", pipeline, lakehouse, "--trigger", "continuous", "--interval", "1s"),
                env=submit_env(),
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_for(lambda: delta_commits(registry.bronze.path) >= 3, 240, "bronze to commit a few batches")
            broker.stop()
            time.sleep(OUTAGE_S)
            assert bronze.poll() is None, f"bronze stopped with the broker down:\n{log.read_text()[-3000:]}"
            broker.start()
            send_to_kafka(generated[half:], broker.bootstrap_servers, topic)

            def everything_ingested() -> bool:
                bronze_rows = spark.read.format("delta").load(registry.bronze.path).count()
                rejected = spark.read.format("delta").load(registry.ops["rejects"].path).count()
                return bronze_rows + rejected >= len(generated)

            wait_for(everything_ingested, 300, "bronze to take in the rest", interval=2)
            assert bronze.poll() is None, log.read_text()[-3000:]
        finally:
            kill_hard(bronze)
    finally:
        broker.stop()
    assert_bronze_reconciles(spark, registry, Manifest.of(generated), generated)
