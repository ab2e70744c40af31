"""The event-time rules on the Spark side (``transforms.windows``) on tiny inline
DataFrames, each against the plain-Python rule of ``eventtime.windows`` or a
literal expectation: firing, cleanup, a window's status, and which windows a
micro-batch may still change."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from spark_jobs.eventtime import windows as model
from spark_jobs.eventtime.clock import MAX_WATERMARK, MIN_WATERMARK
from spark_jobs.transforms.windows import (
    CLOSED,
    FIRED,
    OPEN,
    in_play,
    is_cleaned,
    is_fired,
    window_status,
)

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
