"""Re-deriving keys makes their status events exactly the recomputed ones
(``detector.replace_events``), on a tiny table written by the real delta-spark."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from spark_jobs.config import load_pipeline
from spark_jobs.engine.detector import replace_events
from spark_jobs.lakehouse.create import create_if_missing
from spark_jobs.tables import TableRegistry

pytestmark = pytest.mark.spark

PIPELINES = Path(__file__).resolve().parents[2] / "spark_jobs" / "pipelines"
FIRST_SEEN = datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
SEEN_AGAIN = datetime(2026, 1, 1, 0, 2, tzinfo=UTC)
NOW = datetime(2026, 1, 1, 0, 3, tzinfo=UTC)


def at(minute: int) -> datetime:
    return datetime(2026, 1, 1, 0, minute, tzinfo=UTC)


def events_of(spark, path: str) -> list[tuple]:
    """Sorted rows, timestamps as aware UTC datetimes (Spark returns them naive, in UTC)."""
    rows = spark.read.format("delta").load(path).collect()
    aware = (
        tuple(value.replace(tzinfo=UTC) if isinstance(value, datetime) else value for value in row)
        for row in rows
    )
    return sorted(aware)


def test_re_derived_keys_keep_each_event_once_with_its_first_detection_and_lose_what_no_longer_happens(
    spark, tmp_path
):
    registry = TableRegistry(load_pipeline(PIPELINES / "telemetry.yaml"), str(tmp_path))
    table = registry.status_events
    create_if_missing(spark, table)
    stored = [
        # A copy of one event: a detector batch appended what a re-derivation had just written.
        ("a", "offline", at(30), 100, FIRST_SEEN),
        ("a", "offline", at(30), 200, SEEN_AGAIN),
        ("a", "online", at(40), 100, FIRST_SEEN),  # no longer happens
        ("b", "offline", at(30), 100, FIRST_SEEN),  # a key not re-derived
    ]
    spark.createDataFrame(stored, table.schema).write.format("delta").mode("append").save(table.path)
    fresh = spark.createDataFrame(
        [("a", "offline", at(30), 300, NOW), ("a", "online", at(50), 300, NOW)], table.schema
    )
    keys = spark.createDataFrame([("a",)], "device_id string")

    replace_events(spark, table, ("device_id",), keys, fresh)

    assert events_of(spark, table.path) == [
        ("a", "offline", at(30), 100, FIRST_SEEN),
        ("a", "online", at(50), 300, NOW),
        ("b", "offline", at(30), 100, FIRST_SEEN),
    ]
