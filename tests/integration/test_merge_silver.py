"""The late merge's silver MERGE (``merge_late.merge_silver``) on tiny inline
DataFrames: what it reports of the windows it creates."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pyspark.sql import functions as F

from spark_jobs.jobs import merge_late
from spark_jobs.tables import TableRegistry, create_if_missing
from tests.integration.test_window_store import CONFIG, MINUTE, stored_after_first_batch

pytestmark = pytest.mark.spark

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def late_rows(spark, records: list[tuple[int, str, float]]):
    """(minute, device, battery) quarantined pairs, as the merge reads them."""
    rows = spark.createDataFrame(
        [
            (minute * MINUTE, (minute + 1) * MINUTE, "r1", device, battery, 1.0)
            for minute, device, battery in records
        ],
        "start_ms long, end_ms long, region string, device_id string, battery double, speed double",
    )
    return rows.select(
        F.timestamp_millis("start_ms").alias("window_start"),
        F.timestamp_millis("end_ms").alias("window_end"),
        "region",
        "device_id",
        "battery",
        "speed",
    )


def counts(spark, registry: TableRegistry) -> dict[tuple[int, str], tuple[int, int]]:
    rows = (
        spark.read.format("delta")
        .load(registry.silver.path)
        .select(
            F.unix_millis("window_start").alias("start_ms"), "device_id", "record_count", "late_merged_count"
        )
        .collect()
    )
    return {
        (row.start_ms // MINUTE, row.device_id): (row.record_count, row.late_merged_count) for row in rows
    }


@pytest.fixture
def registry(spark, tmp_path) -> TableRegistry:
    """Silver holding one fired window: minute 0 of device d1."""
    registry = TableRegistry(CONFIG, str(tmp_path))
    create_if_missing(spark, registry.silver)
    stored_after_first_batch(spark, [(0, "d1", 50.0, 1)], MINUTE).write.format("delta").mode("append").save(
        registry.silver.path
    )
    return registry


def test_the_silver_merge_reports_the_windows_it_creates_and_not_the_ones_it_revises(spark, registry):
    # Minute 0 of d1 exists; minute 0 of d2 and minute 1 of d1 are new.
    late = late_rows(spark, [(0, "d1", 40.0), (0, "d2", 30.0), (1, "d1", 20.0), (1, "d1", 25.0)])
    partials = merge_late.late_partials(late, registry)
    starts = [datetime.fromtimestamp(minute * MINUTE / 1000, UTC) for minute in (0, 1)]

    created = merge_late.merge_silver(spark, registry, partials, starts, ("merge-late:test", 1), NOW)

    assert created == 2
    # Every late record counted once: (minute, device) -> (records, of them late).
    assert counts(spark, registry) == {(0, "d1"): (2, 1), (0, "d2"): (1, 1), (1, "d1"): (2, 2)}


def test_a_silver_merge_its_transaction_already_committed_creates_nothing(spark, registry):
    late = late_rows(spark, [(0, "d2", 30.0)])
    partials = merge_late.late_partials(late, registry)
    starts = [datetime.fromtimestamp(0, UTC)]
    txn = ("merge-late:test", 7)
    assert merge_late.merge_silver(spark, registry, partials, starts, txn, NOW) == 1

    assert merge_late.merge_silver(spark, registry, partials, starts, txn, NOW) == 0
    assert counts(spark, registry) == {(0, "d1"): (1, 0), (0, "d2"): (1, 1)}
