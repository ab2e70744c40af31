"""The event-time rules on the Spark side (``transforms.windows``) on tiny inline
DataFrames, each against the plain-Python rule of ``eventtime.windows`` or a
literal expectation: firing, cleanup, a window's status, which windows a
micro-batch may still change, and judging a micro-batch's pairs."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from spark_jobs.engine.judging import judged_columns
from spark_jobs.eventtime import windows as model
from spark_jobs.eventtime.clock import MAX_WATERMARK, MIN_WATERMARK
from spark_jobs.transforms.windows import (
    CLOSED,
    FIRED,
    OPEN,
    in_play,
    is_cleaned,
    is_fired,
    judge_pairs,
    window_status,
)
from tests.generated_code import classes_compiled, expressions_compiled

pytestmark = pytest.mark.spark

END_MS = 60_000
LATENESS_MS = 30_000


def evaluate(spark, column, rows: list[tuple], schema: str) -> list:
    return [row[0] for row in spark.createDataFrame(rows, schema).select(column).collect()]


def test_a_window_fires_when_the_watermark_reaches_its_last_millisecond(spark):
    fired = evaluate(
        spark,
        is_fired(F.col("end_ms"), F.col("watermark")),
        [(END_MS, END_MS - 2), (END_MS, END_MS - 1), (END_MS, END_MS)],
        "end_ms long, watermark long",
    )
    assert fired == [False, True, True]


def test_a_window_is_cleaned_when_the_watermark_reaches_its_last_millisecond_plus_lateness(spark):
    cleaned = evaluate(
        spark,
        is_cleaned(F.col("end_ms"), F.col("watermark"), LATENESS_MS),
        [(END_MS, END_MS - 2 + LATENESS_MS), (END_MS, END_MS - 1 + LATENESS_MS)],
        "end_ms long, watermark long",
    )
    assert cleaned == [False, True]


def test_the_spark_rules_agree_with_the_python_rules_around_every_boundary(spark):
    ends = [-60_000, 0, 60_000, 120_000]
    watermarks = [MIN_WATERMARK, *range(-1_000, 160_000, 4_999), MAX_WATERMARK]
    rows = [(end, watermark) for end in ends for watermark in watermarks]
    frame = spark.createDataFrame(rows, "end_ms long, watermark long")
    judged = frame.select(
        "end_ms",
        "watermark",
        is_fired(F.col("end_ms"), F.col("watermark")).alias("fired"),
        is_cleaned(F.col("end_ms"), F.col("watermark"), LATENESS_MS).alias("cleaned"),
    ).collect()
    for row in judged:
        window = model.Window(row.end_ms - 60_000, row.end_ms)
        assert row.fired == model.is_fired(window, row.watermark), row
        assert row.cleaned == model.is_cleaned(window, row.watermark, LATENESS_MS), row


def test_a_window_is_open_until_it_fires_then_fired_until_its_lateness_passes_then_closed(spark):
    statuses = evaluate(
        spark,
        window_status(F.col("revision"), F.lit(END_MS), END_MS - 1, LATENESS_MS),
        [(0,), (1,)],
        "revision int",
    )
    assert statuses == [OPEN, FIRED]
    past_lateness = evaluate(
        spark,
        window_status(F.col("revision"), F.lit(END_MS), END_MS - 1 + LATENESS_MS, LATENESS_MS),
        [(0,), (2,)],
        "revision int",
    )
    assert past_lateness == [CLOSED, CLOSED]


def test_only_open_and_fired_windows_are_in_play(spark):
    in_play_statuses = evaluate(spark, in_play(), [(OPEN,), (FIRED,), (CLOSED,)], "status string")
    assert in_play_statuses == [True, True, False]


def pairs_of(spark, rows: list[tuple[int, int]]):
    """(bronze version, window end) pairs."""
    return spark.createDataFrame(rows, "version long, window_end_ms long")


def judged(frame) -> list[tuple]:
    return sorted(
        tuple(row) for row in frame.select("version", "window_end_ms", "watermark", "is_late").collect()
    )


def test_a_pair_is_judged_by_the_watermark_its_own_version_started_with(spark):
    # The same window is on time in version 1 and late in version 2, whose watermark
    # started past its cleanup.
    pairs = pairs_of(spark, [(1, END_MS), (2, END_MS)])

    watermarks = {1: END_MS - 2 + LATENESS_MS, 2: END_MS - 1 + LATENESS_MS}

    assert judged(judge_pairs(pairs, watermarks, LATENESS_MS)) == [
        (1, END_MS, END_MS - 2 + LATENESS_MS, False),
        (2, END_MS, END_MS - 1 + LATENESS_MS, True),
    ]


def test_judging_keeps_the_lowest_watermark(spark):
    pairs = pairs_of(spark, [(7, END_MS)])

    assert judged(judge_pairs(pairs, {7: MIN_WATERMARK}, LATENESS_MS)) == [(7, END_MS, MIN_WATERMARK, False)]


def test_a_pair_of_a_version_without_a_clock_is_not_judged(spark):
    pairs = pairs_of(spark, [(1, END_MS), (3, END_MS)])

    assert judged(judge_pairs(pairs, {1: 0}, LATENESS_MS)) == [(1, END_MS, 0, False)]


def test_versions_apart_are_each_judged_by_their_own_watermark_and_no_other_versions(spark):
    # The lookup keeps version v at slot v mod 8 here: 2 and 11 land on the slots of 10
    # and 3, and 5 on an empty one; none of them has a clock.
    pairs = pairs_of(spark, [(version, END_MS) for version in (2, 3, 5, 9, 10, 11)])

    watermarks = {3: 100, 9: END_MS - 1 + LATENESS_MS, 10: 300}

    assert judged(judge_pairs(pairs, watermarks, LATENESS_MS)) == [
        (3, END_MS, 100, False),
        (9, END_MS, END_MS - 1 + LATENESS_MS, True),
        (10, END_MS, 300, False),
    ]


def test_judging_reads_the_clocks_without_a_broadcast(spark):
    # A broadcast is a Spark job on every micro-batch.
    frame = judge_pairs(pairs_of(spark, [(1, END_MS)]), {1: 0}, LATENESS_MS)

    assert "Broadcast" not in frame._jdf.queryExecution().executedPlan().toString()


def test_judging_a_batch_with_new_clocks_runs_the_code_of_the_one_before(spark):
    # Spark writes long literals into its generated code: passed as long literals,
    # every batch's clocks would compile the plan again.
    pairs = pairs_of(spark, [(1, END_MS), (2, END_MS)])
    with expressions_compiled(spark):
        judged(judge_pairs(pairs, {1: 10, 2: 20}, LATENESS_MS))
        compiled = classes_compiled(spark)

        again = judged(judge_pairs(pairs, {1: 30, 2: END_MS - 1 + LATENESS_MS}, LATENESS_MS))

        assert again == [(1, END_MS, 30, False), (2, END_MS, END_MS - 1 + LATENESS_MS, True)]
        assert classes_compiled(spark) == compiled


def test_a_batch_kept_in_memory_for_judging_holds_no_coordinates_of_its_records(spark):
    """What silver caches of a micro-batch: every column judging, windows and
    watermarks read, none of the ids and paths only a quarantine row carries."""
    timed = spark.createDataFrame(
        [],
        "device_id string, battery double, event_id string, source_partition string, source_file string, "
        "source_offset long, event_time timestamp, ingest_time timestamp, processing_time timestamp, "
        "version long, ts_ms long, is_marker boolean",
    )
    assert judged_columns(timed).columns == [
        "device_id",
        "battery",
        "source_partition",
        "event_time",
        "processing_time",
        "version",
        "ts_ms",
        "is_marker",
    ]
