"""The detector's state after its changes, one behaviour at a time, on tiny inline
state tables: what a MERGE of the changes (matched upserts replaced, matched deletes
removed, unmatched non-deletes inserted) would leave."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pyspark.sql import functions as F

from spark_jobs.engine.detector import BUFFERED, CLOCK, LAST, same_state_row
from spark_jobs.transforms.offline import changed_state

pytestmark = pytest.mark.spark

BEFORE = datetime(2026, 1, 1, tzinfo=UTC)
NOW = datetime(2026, 1, 2, tzinfo=UTC)
STATE = "device_id string, kind string, ts_ms long, status string, version long, updated_at timestamp"
CHANGES = "device_id string, kind string, ts_ms long, status string, action string, version long"


def after(spark, state: list[tuple], changes: list[tuple]) -> set[tuple]:
    rows = changed_state(
        spark.createDataFrame(state, STATE),
        spark.createDataFrame(changes, CHANGES),
        same_state_row(["device_id"]),
        F.lit(NOW).cast("timestamp"),
    )
    # Collected timestamps are naive local times.
    return {(*tuple(row)[:-1], row.updated_at.astimezone(UTC)) for row in rows.collect()}


def test_an_upsert_replaces_the_track_status_and_version_of_its_row(spark):
    state = [("d1", LAST, 10, "ONLINE", None, BEFORE)]

    changed = after(spark, state, [("d1", LAST, 20, "OFFLINE", "upsert", None)])

    assert changed == {("d1", LAST, 20, "OFFLINE", None, NOW)}


def test_an_upsert_without_a_row_adds_it(spark):
    changed = after(spark, [], [("d1", LAST, 20, "ONLINE", "upsert", None)])

    assert changed == {("d1", LAST, 20, "ONLINE", None, NOW)}


def test_the_clock_row_without_a_key_is_upserted_in_place(spark):
    state = [(None, CLOCK, 100, None, 3, BEFORE)]

    changed = after(spark, state, [(None, CLOCK, 200, None, "upsert", 4)])

    assert changed == {(None, CLOCK, 200, None, 4, NOW)}


def test_a_delete_removes_its_buffered_track_and_no_other(spark):
    state = [("d1", BUFFERED, 10, None, None, BEFORE), ("d1", BUFFERED, 11, None, None, BEFORE)]

    changed = after(spark, state, [("d1", BUFFERED, 10, None, "delete", None)])

    assert changed == {("d1", BUFFERED, 11, None, None, BEFORE)}


def test_a_delete_without_a_row_adds_nothing(spark):
    assert after(spark, [], [("d1", BUFFERED, 10, None, "delete", None)]) == set()


def test_an_insert_of_a_track_already_buffered_leaves_its_row_as_it_was(spark):
    state = [("d1", BUFFERED, 10, None, None, BEFORE)]

    changed = after(spark, state, [("d1", BUFFERED, 10, None, "insert", None)])

    assert changed == {("d1", BUFFERED, 10, None, None, BEFORE)}


def test_an_insert_of_a_new_track_adds_it_beside_the_others(spark):
    state = [("d1", BUFFERED, 10, None, None, BEFORE)]

    changed = after(spark, state, [("d1", BUFFERED, 12, None, "insert", None)])

    assert changed == {("d1", BUFFERED, 10, None, None, BEFORE), ("d1", BUFFERED, 12, None, None, NOW)}


def test_rows_no_change_matches_stay_as_they_were(spark):
    state = [("d1", LAST, 10, "ONLINE", None, BEFORE), ("d2", LAST, 11, "ONLINE", None, BEFORE)]

    changed = after(spark, state, [("d2", LAST, 30, "OFFLINE", "upsert", None)])

    assert changed == {("d1", LAST, 10, "ONLINE", None, BEFORE), ("d2", LAST, 30, "OFFLINE", None, NOW)}
