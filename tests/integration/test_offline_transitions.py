"""The window-function form of the buffered timers (transforms/offline.py) on tiny
DataFrames: one behaviour per test, then random streams against the reference
detector (the oracle)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_jobs.eventtime.clock import MIN_WATERMARK
from spark_jobs.eventtime.timers import OfflineDetector
from spark_jobs.transforms.offline import transitions

pytestmark = pytest.mark.spark

KEY = ("device_id",)
TIMEOUT = 100
EXAMPLES = int(os.environ.get("TIDEMARK_ENGINE_EXAMPLES", "6"))


def detect(spark, last: list[tuple], due: list[tuple], watermark: int) -> tuple[list[tuple], list[tuple]]:
    """(sorted events as (device, status, ms), sorted new last rows as (device, ms, status))."""
    last_frame = spark.createDataFrame(last, "device_id string, ts_ms long, status string")
    due_frame = spark.createDataFrame(due, "device_id string, ts_ms long")
    events, new_last = transitions(last_frame, due_frame, KEY, TIMEOUT, watermark)
    return (
        sorted(tuple(row) for row in events.select("device_id", "status", "event_ms").collect()),
        sorted(tuple(row) for row in new_last.select("device_id", "ts_ms", "status").collect()),
    )


def test_a_keys_first_track_emits_nothing_and_arms_its_timer(spark):
    assert detect(spark, [], [("d", 10)], watermark=50) == ([], [("d", 10, "online")])


def test_a_gap_longer_than_the_timeout_is_offline_at_the_timer_and_online_at_the_track(spark):
    events, last = detect(spark, [], [("d", 10), ("d", 111)], watermark=120)
    assert events == [("d", "offline", 110), ("d", "online", 111)]
    assert last == [("d", 111, "online")]


def test_a_track_exactly_one_timeout_later_keeps_the_key_online(spark):
    assert detect(spark, [], [("d", 10), ("d", 110)], watermark=150)[0] == []


def test_a_timer_fires_once_the_watermark_reaches_it(spark):
    assert detect(spark, [("d", 10, "online")], [], watermark=109) == ([], [])
    assert detect(spark, [("d", 10, "online")], [], watermark=110) == (
        [("d", "offline", 110)],
        [("d", 10, "offline")],
    )


def test_an_offline_key_comes_back_online_with_its_next_track(spark):
    events, last = detect(spark, [("d", 10, "offline")], [("d", 500)], watermark=550)
    assert events == [("d", "online", 500)]
    assert last == [("d", 500, "online")]


def test_keys_are_independent(spark):
    events, _ = detect(spark, [("a", 0, "online")], [("b", 0), ("b", 300)], watermark=400)
    assert sorted(events, key=lambda event: (event[0], event[2])) == [
        ("a", "offline", 100),
        ("b", "offline", 100),
        ("b", "online", 300),
        ("b", "offline", 400),
    ]


@st.composite
def streams(draw):
    """Arrival-ordered batches of (device, ts) with the watermark after each batch."""
    batches = []
    watermark = MIN_WATERMARK
    for _ in range(draw(st.integers(1, 5))):
        tracks = draw(st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 600)), max_size=6))
        step = draw(st.integers(0, 250))
        watermark = max(watermark, max((ts for _, ts in tracks), default=0) - step)
        batches.append((tracks, watermark))
    return batches


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=streams())
def test_batch_after_batch_the_events_equal_the_reference_detector(spark, batches):
    reference = OfflineDetector(TIMEOUT)
    expected: list[tuple] = []
    engine: list[tuple] = []
    last: dict[str, tuple] = {}
    buffer: set[tuple] = set()
    before = MIN_WATERMARK
    for tracks, after in batches:
        events, _ = reference.process_batch(tracks, before, after)
        expected += [(e.key, e.status, e.event_time) for e in events]
        buffer |= {track for track in tracks if track[1] > before}
        due = sorted(track for track in buffer if track[1] <= after)
        buffer -= set(due)
        found, new_last = detect(spark, list(last.values()), due, after)
        engine += found
        last.update({row[0]: row for row in new_last})
        before = after
    assert sorted(engine) == sorted(expected)
