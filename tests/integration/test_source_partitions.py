"""A source's silent partitions hold the watermark, and unread input is backlog
(Flink's Kafka source: a partition without data holds the watermark at its
minimum until it is declared idle).

On a real Kafka broker: partitions produced only after bronze and silver consumed
the others, and a partition whose unread lag must keep it from going idle while
bronze is stalled. On the files source: partitions declared with
``source.partitions`` that have not landed yet. Every test ends with the exact
reconciliation: input = on-time records in silver + quarantined + rejected."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from spark_jobs.engine import watermark_steps
from spark_jobs.eventtime.clock import MIN_WATERMARK
from spark_jobs.generator import FleetSpec, Manifest, generate, malformed_kinds, send_to_kafka, write_landing
from spark_jobs.jobs import check_idle
from spark_jobs.tables import TableRegistry
from tests.integration.conftest import assert_bronze_reconciles, registry_for, write_pipeline
from tests.integration.engine import batch_computation, engine_history, run_jobs

pytestmark = [pytest.mark.spark, pytest.mark.slow]

MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS
# Every partition in event-time order within its 5 s bound, tumbling 1 min windows.
WATERMARK = {"strategy": "bounded", "max_out_of_orderness": "5s"}


def end_input(spark, registry: TableRegistry) -> None:
    assert watermark_steps.flush(spark, registry)
    run_jobs(spark, registry, "gold", "offline")


def kafka_pipeline(tmp_path: Path, broker, topic: str, idleness: str) -> tuple[Path, TableRegistry]:
    broker.create_topic(topic, 4)
    pipeline = write_pipeline(
        tmp_path,
        source={"kind": "kafka", "bootstrap_servers": broker.bootstrap_servers, "topic": topic},
        watermark={**WATERMARK, "idleness": idleness},
        allowed_lateness="0s",
    )
    return pipeline, registry_for(pipeline, tmp_path / "lakehouse")


def fleet(seed: int, partitions: int = 4, source_kind: str = "kafka") -> list:
    """Two hours of telemetry, with devices going offline and malformed records."""
    spec = FleetSpec(
        devices=16,
        partitions=partitions,
        seed=seed,
        duration_ms=2 * HOUR_MS,
        interval_ms=MINUTE_MS,
        offline_ratio=0.02,
        malformed_ratio=0.02,
    )
    return generate(spec, malformed_kinds(source_kind))


def history_watermarks(spark, registry: TableRegistry) -> set[int]:
    return {step[0] for step in engine_history(spark, registry)}


def partition_clocks(spark, registry: TableRegistry) -> dict[str, tuple[int, bool]]:
    rows = (
        spark.read.format("delta")
        .load(registry.ops["watermarks"].path)
        .where(f"pipeline = '{registry.config.name}'")
        .collect()
    )
    return {row.source_partition: (row.partition_watermark, row.is_idle) for row in rows}


def assert_exact(spark, registry: TableRegistry, generated: list) -> None:
    """Nothing late, silver equal to a batch group-by, the status events equal to a
    batch computation, and input = silver + quarantine + rejects, record for record."""
    valid = [record.payload for record in generated if record.reason is None]
    table = spark.read.format("delta").load
    assert table(registry.quarantine.path).count() == 0
    assert table(registry.late_tracks.path).count() == 0
    silver_counts = {
        (row.start, row.region, row.device_id): row.record_count
        for row in table(registry.silver.path)
        .selectExpr("unix_millis(window_start) AS start", "region", "device_id", "record_count")
        .collect()
    }
    grouped = Counter((r["ts"] // MINUTE_MS * MINUTE_MS, r["region"], r["device_id"]) for r in valid)
    assert silver_counts == dict(grouped)
    events = [
        tuple(row)
        for row in table(registry.status_events.path)
        .selectExpr("device_id", "status", "unix_millis(event_time)")
        .collect()
    ]
    expected = batch_computation([(r["device_id"], r["ts"]) for r in valid], 30 * MINUTE_MS)
    assert any(status == "offline" for _, status, _ in expected), "the fleet must go offline now and then"
    assert sorted(events) == expected
    assert_bronze_reconciles(spark, registry, Manifest.of(generated), generated)
    quarantined = table(registry.quarantine.path).count()
    rejected = table(registry.ops["rejects"].path).where(f"pipeline = '{registry.config.name}'").count()
    assert sum(silver_counts.values()) + quarantined + rejected == len(generated)


def test_kafka_partitions_produced_after_the_others_were_consumed_are_on_time(spark, tmp_path, kafka_broker):
    _, registry = kafka_pipeline(tmp_path, kafka_broker, "late_partitions", idleness="1h")
    generated = fleet(seed=21)
    first = [record for record in generated if record.partition in (0, 1)]
    send_to_kafka(first, kafka_broker.bootstrap_servers, "late_partitions")
    run_jobs(spark, registry, "bronze", "silver", "offline")

    # Partitions 2 and 3 exist but sent nothing: the watermark stays at -inf.
    assert history_watermarks(spark, registry) == {MIN_WATERMARK}
    assert partition_clocks(spark, registry)["3"] == (MIN_WATERMARK, False)

    rest = [record for record in generated if record.partition in (2, 3)]
    send_to_kafka(rest, kafka_broker.bootstrap_servers, "late_partitions")
    run_jobs(spark, registry, "bronze", "silver")
    end_input(spark, registry)

    assert_exact(spark, registry, generated)


def test_a_lagging_partition_is_never_idle_and_a_stalled_kafka_bronze_is_reported(
    spark, tmp_path, kafka_broker, capsys
):
    pipeline, registry = kafka_pipeline(tmp_path, kafka_broker, "lagging", idleness="2s")
    generated = fleet(seed=22)
    # Partition 3 is an hour behind the others when bronze stops.
    behind = generated[0].arrival_ms + HOUR_MS
    held_back = [record for record in generated if record.partition == 3 and record.arrival_ms >= behind]
    sent = [record for record in generated if record.partition != 3 or record.arrival_ms < behind]
    send_to_kafka(sent, kafka_broker.bootstrap_servers, "lagging")
    run_jobs(spark, registry, "bronze", "silver")
    watermark = max(history_watermarks(spark, registry))

    send_to_kafka(held_back, kafka_broker.bootstrap_servers, "lagging")
    time.sleep(2.5)  # partition 3 has sent bronze nothing for longer than the idleness timeout
    code = check_idle.main(
        ["--pipeline", str(pipeline), "--lakehouse", str(registry.root), "--stall-after", "1s"]
    )

    report = capsys.readouterr()
    assert code == check_idle.STALLED_EXIT, report.out
    assert f"Kafka lag 3: {len(held_back)}" in report.out
    assert f"Kafka lag of {len(held_back)} records on partitions 3" in report.err
    assert partition_clocks(spark, registry)["3"][1] is False, "a partition with unread input went idle"
    assert max(history_watermarks(spark, registry)) == watermark, "the watermark moved"
    # The Airflow page applies the same rule: a lagging partition, and a stall
    # once bronze has not committed for the page's stall limit.
    from tidemark_airflow import ui

    page = ui.kafka_backlog(registry.root, registry.config, datetime.now(UTC) + timedelta(minutes=10))
    assert page["lag"] == {"3": len(held_back)}
    assert f"{len(held_back)} records on partitions 3" in page["stalled"]

    run_jobs(spark, registry, "bronze", "silver")
    end_input(spark, registry)
    assert_exact(spark, registry, generated)


def test_a_declared_file_partition_that_has_not_landed_holds_the_watermark(spark, tmp_path):
    landing = tmp_path / "landing"
    pipeline = write_pipeline(
        tmp_path,
        source={"kind": "files", "path": str(landing), "format": "json", "partitions": 3},
        watermark={**WATERMARK, "idleness": "1h"},
        allowed_lateness="0s",
    )
    registry = registry_for(pipeline, tmp_path / "lakehouse")
    generated = fleet(seed=23, partitions=3, source_kind="files")
    write_landing([r for r in generated if r.partition != 2], landing, records_per_file=200)
    run_jobs(spark, registry, "bronze", "silver")

    assert history_watermarks(spark, registry) == {MIN_WATERMARK}
    assert partition_clocks(spark, registry)["2"] == (MIN_WATERMARK, False)

    write_landing([r for r in generated if r.partition == 2], landing, records_per_file=200)
    run_jobs(spark, registry, "bronze", "silver")
    end_input(spark, registry)
    assert_exact(spark, registry, generated)
