"""What a micro-batch makes of the windows in play (``window_store.updated_windows``)
and which change-feed rows a commit changed (``tables.changed_rows``), on tiny
inline DataFrames with literal expectations: one behaviour per test."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pyspark.sql import functions as F

from spark_jobs.engine.clocks import VersionClock
from spark_jobs.engine.window_store import updated_windows
from spark_jobs.eventtime.clock import MIN_WATERMARK
from spark_jobs.lakehouse.reads import changed_rows
from spark_jobs.tables import TableRegistry
from spark_jobs.transforms.windows import CLOSED, FIRED, OPEN, in_play, window_partials
from tests.generated_code import classes_compiled, expressions_compiled
from tests.integration.engine import engine_config

pytestmark = pytest.mark.spark

MINUTE = 60_000
LATENESS_MS = 30_000
CONFIG = engine_config(
    {"type": "tumbling", "size": "1m", "offset": "0s"},
    {"strategy": "bounded", "max_out_of_orderness": "0s"},
    "30s",
)
EARLIER = datetime(2026, 11, 26, 11, 0, tzinfo=UTC)
NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
# The first minute's window fires at its last millisecond and closes 30 s later.
BEFORE_FIRING = MINUTE - 2
AT_FIRING = MINUTE - 1
AT_CLEANUP = MINUTE - 1 + LATENESS_MS


def partials(spark, records: list[tuple[int, str, float, int]], run_versions: list[int]):
    """(minute, device, battery, bronze version) on-time pairs of a run of the
    micro-batches ``run_versions`` -> window partials."""
    pairs = spark.createDataFrame(
        [
            (minute * MINUTE, (minute + 1) * MINUTE, "r1", device, battery, 1.0, version)
            for minute, device, battery, version in records
        ],
        "window_start_ms long, window_end_ms long, region string, device_id string, "
        "battery double, speed double, version long",
    )
    return window_partials(pairs, CONFIG, run_versions)


def batch(spark, in_play_windows, records, clocks: list[tuple[int, int]], now: datetime):
    """The windows in play after one micro-batch of ``records`` whose bronze versions
    move the watermark as ``clocks`` (version, watermark after) say."""
    plan = [VersionClock(version, 0, MIN_WATERMARK, watermark, 1, 0) for version, watermark in clocks]
    return updated_windows(
        in_play_windows, partials(spark, records, [v for v, _ in clocks]), CONFIG, plan, now
    )


def nothing_in_play(spark):
    return spark.createDataFrame([], TableRegistry(CONFIG, "/unused").silver.schema)


def stored_after_first_batch(spark, records, watermark: int):
    """The windows in play after a first micro-batch (version 1) at ``EARLIER``."""
    windows = batch(spark, nothing_in_play(spark), records, [(1, watermark)], EARLIER)
    return spark.createDataFrame(windows.where(in_play()).collect(), windows.schema)


def rows(windows) -> dict:
    """(minute, device) -> (records, battery min, battery sum, revision, status, updated_at ms)."""
    selected = windows.select(
        (F.unix_millis("window_start") / MINUTE).cast("int"),
        "device_id",
        "record_count",
        "battery_min",
        "battery_sum",
        "revision",
        "status",
        F.unix_millis("updated_at"),
    ).collect()
    return {(row[0], row[1]): tuple(row[2:]) for row in selected}


def millis(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def test_a_partial_for_a_new_window_is_inserted_open_until_the_watermark_reaches_it(spark):
    windows = batch(spark, nothing_in_play(spark), [(0, "d1", 50.0, 1)], [(1, BEFORE_FIRING)], NOW)

    assert rows(windows) == {(0, "d1"): (1, 50.0, 50.0, 0, OPEN, millis(NOW))}


def test_a_partial_for_an_open_window_adds_its_records_and_measures(spark):
    stored = stored_after_first_batch(spark, [(0, "d1", 50.0, 1), (0, "d1", 70.0, 1)], 10_000)

    windows = batch(spark, stored, [(0, "d1", 40.0, 2)], [(2, BEFORE_FIRING)], NOW)

    assert rows(windows) == {(0, "d1"): (3, 40.0, 160.0, 0, OPEN, millis(NOW))}


def test_a_quiet_window_the_watermark_passes_fires_as_revision_one(spark):
    stored = stored_after_first_batch(spark, [(0, "d1", 50.0, 1)], 10_000)

    windows = batch(spark, stored, [(1, "d2", 60.0, 2)], [(2, AT_FIRING)], NOW)

    assert rows(windows)[(0, "d1")] == (1, 50.0, 50.0, 1, FIRED, millis(NOW))


def test_a_fired_window_past_its_allowed_lateness_closes_at_the_same_revision(spark):
    stored = stored_after_first_batch(spark, [(0, "d1", 50.0, 1)], AT_FIRING)

    windows = batch(spark, stored, [(2, "d2", 60.0, 2)], [(2, AT_CLEANUP)], NOW)

    assert rows(windows)[(0, "d1")] == (1, 50.0, 50.0, 1, CLOSED, millis(NOW))


def test_records_for_a_fired_window_re_fire_it(spark):
    stored = stored_after_first_batch(spark, [(0, "d1", 50.0, 1)], AT_FIRING)

    windows = batch(spark, stored, [(0, "d1", 30.0, 2)], [(2, AT_FIRING + 1)], NOW)

    assert rows(windows) == {(0, "d1"): (2, 30.0, 80.0, 2, FIRED, millis(NOW))}


def test_records_that_arrive_before_a_window_first_fires_are_part_of_revision_one(spark):
    stored = stored_after_first_batch(spark, [(0, "d1", 50.0, 1)], 10_000)

    windows = batch(spark, stored, [(0, "d1", 30.0, 2)], [(2, AT_FIRING)], NOW)

    assert rows(windows) == {(0, "d1"): (2, 30.0, 80.0, 1, FIRED, millis(NOW))}


def test_a_window_nothing_changed_keeps_its_row_and_its_updated_at(spark):
    stored = stored_after_first_batch(spark, [(0, "d1", 50.0, 1)], 10_000)

    windows = batch(spark, stored, [(0, "d2", 60.0, 2)], [(2, BEFORE_FIRING)], NOW)

    assert rows(windows) == {
        (0, "d1"): (1, 50.0, 50.0, 0, OPEN, millis(EARLIER)),
        (0, "d2"): (1, 60.0, 60.0, 0, OPEN, millis(NOW)),
    }


def test_a_micro_batch_with_a_new_watermark_and_time_runs_the_code_of_the_one_before(spark):
    # Spark writes long and timestamp literals into its generated code: passed as
    # literals, every batch's watermark and time would compile the plan again.
    stored = stored_after_first_batch(spark, [(0, "d1", 50.0, 1)], 10_000)
    with expressions_compiled(spark):
        rows(batch(spark, stored, [(0, "d1", 30.0, 2)], [(2, BEFORE_FIRING)], EARLIER))
        compiled = classes_compiled(spark)

        windows = batch(spark, stored, [(0, "d1", 30.0, 2)], [(2, AT_FIRING)], NOW)

        assert rows(windows) == {(0, "d1"): (2, 30.0, 80.0, 1, FIRED, millis(NOW))}
        assert classes_compiled(spark) == compiled


def versions_of_partials(spark, records: list[tuple[int, str, int]], run_versions: list[int]) -> dict:
    """(minute, device, version) pairs -> (minute, device) -> the partial's ``versions``."""
    made = partials(
        spark, [(minute, device, 50.0, version) for minute, device, version in records], run_versions
    )
    selected = made.select((F.col("window_start_ms") / MINUTE).cast("int"), "device_id", "versions").collect()
    return {(row[0], row[1]): row[2] for row in selected}


def test_a_partial_lists_each_micro_batch_that_added_to_it_once_in_order(spark):
    records = [(0, "d1", 7), (0, "d1", 3), (0, "d1", 7), (0, "d2", 5)]

    assert versions_of_partials(spark, records, [3, 5, 7]) == {(0, "d1"): [3, 7], (0, "d2"): [5]}


def test_a_partial_lists_its_micro_batches_of_a_run_of_more_than_sixty_four(spark):
    # Sixty-four micro-batches to a word of bits: the 64th (the sign bit), the 65th
    # (the next word's first) and the last of 130 (a third word).
    run = list(range(1000, 1130))
    records = [(0, "d1", 1063), (0, "d1", 1064), (0, "d1", 1129), (0, "d2", 1000), (0, "d2", 1063)]

    assert versions_of_partials(spark, records, run) == {
        (0, "d1"): [1063, 1064, 1129],
        (0, "d2"): [1000, 1063],
    }


def test_a_partial_lists_its_micro_batches_of_a_run_whose_versions_have_gaps(spark):
    records = [(0, "d1", 40), (0, "d1", 9), (1, "d1", 41)]

    assert versions_of_partials(spark, records, [9, 40, 41, 300]) == {(0, "d1"): [9, 40], (1, "d1"): [41]}


def shuffles(frame) -> int:
    """The hash-partitioning exchanges in ``frame``'s physical plan."""
    return frame._jdf.queryExecution().executedPlan().toString().count("Exchange hashpartitioning")


def test_a_micro_batch_shuffles_its_partials_once_and_the_windows_in_play_once(spark):
    # The partials' aggregate is partitioned by (window, key); joined on the same
    # columns, the windows in play move to the partials, not the partials again.
    stored = stored_after_first_batch(spark, [(0, "d1", 50.0, 1)], 10_000)

    windows = batch(spark, stored, [(0, "d1", 30.0, 2)], [(2, BEFORE_FIRING)], NOW)

    assert shuffles(windows) == 2
    assert rows(windows) == {(0, "d1"): (2, 30.0, 80.0, 0, OPEN, millis(NOW))}


def change_feed_rows(spark, rows: list[tuple[str, int, str, int]]):
    return spark.createDataFrame(
        rows, "window string, revision int, _change_type string, _commit_version long"
    )


def test_a_row_a_commit_rewrote_unchanged_is_not_a_change(spark):
    feed = change_feed_rows(spark, [("w1", 1, "delete", 5), ("w1", 1, "insert", 5)])

    assert changed_rows(feed).collect() == []


def test_a_row_a_commit_rewrote_changed_is_a_change_as_it_is_after(spark):
    feed = change_feed_rows(
        spark,
        [
            ("w1", 0, "delete", 5),
            ("w1", 1, "insert", 5),
            ("w2", 1, "update_preimage", 6),
            ("w2", 2, "update_postimage", 6),
        ],
    )

    assert sorted(map(tuple, changed_rows(feed).collect())) == [("w1", 1), ("w2", 2)]


def test_a_row_deleted_in_one_commit_and_inserted_in_another_is_a_change(spark):
    feed = change_feed_rows(spark, [("w1", 1, "delete", 5), ("w1", 1, "insert", 6)])

    assert [tuple(row) for row in changed_rows(feed).collect()] == [("w1", 1)]
