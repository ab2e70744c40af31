import itertools
import random

import pytest

from spark_jobs.eventtime import MAX_WATERMARK, MIN_WATERMARK, OfflineDetector

MINUTE = 60_000


def hms(h: int, m: int, s: int) -> int:
    return ((h * 60 + m) * 60 + s) * 1_000


BIRD_TRACKS = [hms(17, 30, 15), hms(17, 30, 20), hms(17, 30, 25), hms(18, 0, 32)]
BIRD_EVENTS = [(hms(18, 0, 25), "offline"), (hms(18, 0, 32), "online"), (hms(18, 30, 32), "offline")]


def run(batches, bound_ms=5_000):
    """Feed batches of track timestamps with a bounded watermark, then end the input."""
    detector = OfflineDetector(30 * MINUTE)
    watermark, events = MIN_WATERMARK, []
    seen = None
    for batch in batches:
        seen = max([*batch, seen]) if seen is not None else max(batch)
        after = max(watermark, seen - bound_ms - 1)
        emitted, late = detector.process_batch([("bird", ts) for ts in batch], watermark, after)
        assert late == []
        events += emitted
        watermark = after
    events += detector.advance(MAX_WATERMARK)
    return [(e.event_time, e.status) for e in events]


def test_bird_tracks_in_one_batch_give_offline_then_online():
    assert run([BIRD_TRACKS]) == BIRD_EVENTS


def test_bird_tracks_one_per_batch_give_the_same_events():
    assert run([[ts] for ts in BIRD_TRACKS]) == BIRD_EVENTS


@pytest.mark.parametrize("seed", range(20))
def test_bird_tracks_in_random_splits_give_the_same_events(seed):
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(BIRD_TRACKS)), rng.randint(0, len(BIRD_TRACKS) - 1)))
    bounds = [0, *cuts, len(BIRD_TRACKS)]
    assert run([BIRD_TRACKS[a:b] for a, b in itertools.pairwise(bounds)]) == BIRD_EVENTS


def test_a_track_at_or_below_the_watermark_is_returned_as_late():
    detector = OfflineDetector(MINUTE)
    events, late = detector.process_batch([("k", 1_000), ("k", 5_000)], 1_000, 2_000)
    assert late == [("k", 1_000)] and events == []


def test_a_track_exactly_at_the_timeout_keeps_the_key_online():
    detector = OfflineDetector(MINUTE)
    detector.process_batch([("k", 0), ("k", MINUTE)], MIN_WATERMARK, MINUTE)
    assert detector.advance(MINUTE + 1) == []
