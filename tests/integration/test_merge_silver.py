"""The late merge's silver write (``late_merge.merge_silver``) on tiny inline
DataFrames: what it makes of closed windows, and that its footprint (the closed
files of the windows it changes) never meets the silver stream's (the windows in
play), so neither fails the other."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from spark_jobs.engine import late_merge
from spark_jobs.engine.window_store import fired_windows, in_play_writer
from spark_jobs.lakehouse.create import create_if_missing
from spark_jobs.lakehouse.log import table_version
from spark_jobs.lakehouse.transaction import Rewrite
from spark_jobs.tables import TableRegistry
from spark_jobs.transforms.windows import CLOSED, FIRED
from tests.integration.test_window_store import (
    AT_FIRING,
    CONFIG,
    LATENESS_MS,
    MINUTE,
    stored_after_first_batch,
)

pytestmark = pytest.mark.spark

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
TXN = ("merge-late:test", 1)


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


def windows(spark, registry: TableRegistry) -> dict[tuple[int, str], tuple[int, int, int, str]]:
    """(minute, device) -> (records, of them late-merged, revision, status)."""
    rows = spark.read.format("delta").load(registry.silver.path).collect()
    return {
        (int(row.window_start.timestamp() * 1000) // MINUTE, row.device_id): (
            row.record_count,
            row.late_merged_count,
            row.revision,
            row.status,
        )
        for row in rows
    }


def stored(spark, minute: int, device: str, status: str):
    """A fired window of one on-time record, as silver holds it, given ``status``."""
    row = stored_after_first_batch(spark, [(minute, device, 50.0, 1)], (minute + 1) * MINUTE - 1)
    return row.withColumn("revision", F.lit(1)).withColumn("status", F.lit(status))


@pytest.fixture
def registry(spark, tmp_path) -> TableRegistry:
    """Silver holding closed windows (minutes 0 and 3 of d1) and a fired one (minute 5 of d9)."""
    registry = TableRegistry(CONFIG, str(tmp_path))
    create_if_missing(spark, registry.silver)
    for minute, device, status in ((0, "d1", CLOSED), (3, "d1", CLOSED), (5, "d9", FIRED)):
        stored(spark, minute, device, status).write.format("delta").mode("append").save(registry.silver.path)
    return registry


def merge(spark, registry: TableRegistry, records: list[tuple[int, str, float]], txn=TXN) -> Rewrite | None:
    partials = late_merge.late_partials(late_rows(spark, records), registry)
    starts = sorted({datetime.fromtimestamp(minute * MINUTE / 1000, UTC) for minute, _, _ in records})
    return late_merge.merge_silver(spark, registry, partials, starts, txn, NOW, "merge:test")


def test_late_records_are_folded_into_their_closed_windows_and_open_new_ones_closed(spark, registry):
    # Minute 0 of d1 is closed in silver; minute 0 of d2 and minute 1 of d1 are new.
    written = merge(spark, registry, [(0, "d1", 40.0), (0, "d2", 30.0), (1, "d1", 20.0), (1, "d1", 25.0)])

    assert written.rows_written - written.rows_replaced == 2  # the windows it created
    assert windows(spark, registry) == {
        (0, "d1"): (2, 1, 2, CLOSED),
        (0, "d2"): (1, 1, 1, CLOSED),
        (1, "d1"): (2, 2, 1, CLOSED),
        (3, "d1"): (1, 0, 1, CLOSED),
        (5, "d9"): (1, 0, 1, FIRED),
    }


def test_a_silver_write_whose_transaction_committed_writes_nothing(spark, registry):
    assert merge(spark, registry, [(0, "d2", 30.0)]) is not None
    version = table_version(spark, registry.silver.path)

    assert merge(spark, registry, [(0, "d2", 30.0)]) is None
    assert table_version(spark, registry.silver.path) == version
    assert windows(spark, registry)[(0, "d2")] == (1, 1, 1, CLOSED)


def commit_actions(registry: TableRegistry, version: int) -> list[dict]:
    log = Path(registry.silver.path) / "_delta_log" / f"{version:020d}.json"
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_the_silver_write_replaces_only_closed_files_of_the_windows_it_changes(spark, registry):
    actions = commit_actions(registry, merge(spark, registry, [(0, "d1", 40.0)]).version)
    removed = [action["remove"]["path"] for action in actions if "remove" in action]
    added = [action["add"]["partitionValues"]["status"] for action in actions if "add" in action]
    # One closed file: minute 0's. Minute 3's closed file and the fired window's stay.
    assert len(removed) == 1 and removed[0].startswith("status=closed/")
    assert added == [CLOSED]
    assert windows(spark, registry)[(3, "d1")] == (1, 0, 1, CLOSED)


def closing_everything(in_play):
    """The stream's step that closes the fired window of minute 5 (watermark past its cleanup)."""
    return fired_windows(in_play, AT_FIRING + 5 * MINUTE + LATENESS_MS, LATENESS_MS, NOW)


def test_a_merge_committing_inside_a_silver_stream_write_does_not_fail_it(spark, registry):
    merged_inside = []

    def with_a_merge_inside(in_play):
        merged_inside.append(merge(spark, registry, [(3, "d1", 10.0)]))
        return closing_everything(in_play)

    in_play_writer(registry).overwrite(spark, with_a_merge_inside, "stream:1")

    assert merged_inside[0] is not None
    assert windows(spark, registry) == {
        (0, "d1"): (1, 0, 1, CLOSED),
        (3, "d1"): (2, 1, 2, CLOSED),
        (5, "d9"): (1, 0, 1, CLOSED),
    }


def test_a_silver_stream_write_committing_inside_the_merge_does_not_fail_it(spark, registry, monkeypatch):
    folded = late_merge.with_late_partials

    def with_the_stream_inside(closed, partials, config, now):
        in_play_writer(registry).overwrite(spark, closing_everything, "stream:1")
        return folded(closed, partials, config, now)

    monkeypatch.setattr(late_merge, "with_late_partials", with_the_stream_inside)

    assert merge(spark, registry, [(0, "d1", 40.0)]) is not None
    assert windows(spark, registry) == {
        (0, "d1"): (2, 1, 2, CLOSED),
        (3, "d1"): (1, 0, 1, CLOSED),
        (5, "d9"): (1, 0, 1, CLOSED),
    }
