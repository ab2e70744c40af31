"""Offline detection on real Spark and Delta, driven through `tidemark replay`:
Bird's table (seed 003) at any micro-batching, determinism live vs backfill on
generated fleets, and late tracks folded back in by the late merge."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from spark_jobs.engine import watermark_steps
from spark_jobs.eventtime.clock import MAX_WATERMARK
from spark_jobs.eventtime.timers import OfflineDetector
from spark_jobs.generator import FleetSpec, generate
from spark_jobs.jobs import offline
from spark_jobs.jobs.common import JobContext
from spark_jobs.tables import TableRegistry, join
from tests.integration.engine import (
    BASE_MS,
    BOUNDED,
    OFFLINE,
    TUMBLING,
    assert_reconciles,
    batch_computation,
    engine_config,
    payload,
    replay_batches,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def at(clock: str) -> int:
    """Epoch millis of a wall-clock time on the first day of 2026 (UTC)."""
    hours, minutes, seconds = (int(part) for part in clock.split(":"))
    return BASE_MS + ((hours * 60 + minutes) * 60 + seconds) * 1000


BIRD_TRACKS = [at("17:30:15"), at("17:30:20"), at("17:30:25"), at("18:00:32")]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("offline")


def status_events(spark, registry: TableRegistry) -> list[tuple]:
    """(device, status, event time ms, watermark at detection), in event-time order."""
    rows = spark.sql(
        f"SELECT device_id, status, unix_millis(event_time) AS ms, watermark "
        f"FROM delta.`{registry.status_events.path}` ORDER BY ms, device_id, status"
    ).collect()
    return [tuple(row) for row in rows]


def end_input(spark, registry: TableRegistry) -> None:
    """Flush, as `replay --flush` would, then let offline detection take the step."""
    assert watermark_steps.flush(spark, registry)
    checkpoint = join(registry.root, "_checkpoints", registry.config.name, "offline")
    context = JobContext("offline", registry.config, registry, "available-now", 1_000, checkpoint)
    assert offline.run(spark, context) == 0


def bird_splits() -> dict[str, list[list[int]]]:
    rng = random.Random(3)
    splits = {"one batch": [BIRD_TRACKS], "one per batch": [[ts] for ts in BIRD_TRACKS]}
    for example in range(2):
        cuts = sorted(rng.sample(range(1, len(BIRD_TRACKS)), rng.randint(1, 2)))
        bounds = [0, *cuts, len(BIRD_TRACKS)]
        splits[f"random split {example}"] = [BIRD_TRACKS[a:b] for a, b in itertools.pairwise(bounds)]
    return splits


@pytest.mark.parametrize("split", list(bird_splits()))
def test_birds_table_gives_offline_online_and_after_the_flush_offline_at_any_batching(spark, root, split):
    batches = [[payload(0, ts, "scooter-1", 80.0, 10.0) for ts in batch] for batch in bird_splits()[split]]
    config = engine_config(TUMBLING, BOUNDED, offline=OFFLINE)
    registry = replay_batches(spark, config, root, batches)
    # The watermark stops 5 s behind 18:00:32: the timer at 18:00:25 has fired,
    # the track at 18:00:32 waits in the buffer.
    watermark = at("18:00:32") - 5_000 - 1
    assert status_events(spark, registry) == [("scooter-1", "offline", at("18:00:25"), watermark)]

    end_input(spark, registry)
    assert status_events(spark, registry) == [
        ("scooter-1", "offline", at("18:00:25"), watermark),
        ("scooter-1", "online", at("18:00:32"), MAX_WATERMARK),
        ("scooter-1", "offline", at("18:30:32"), MAX_WATERMARK),
    ]
    assert spark.read.format("delta").load(registry.late_tracks.path).count() == 0
    assert_reconciles(spark, registry, [record for batch in batches for record in batch])


def test_a_track_exactly_one_timeout_after_the_last_keeps_the_key_online(spark, root):
    tracks = [at("10:00:00"), at("10:30:00"), at("11:00:00")]
    batches = [[payload(0, ts, "scooter-2", 50.0, 5.0)] for ts in tracks]
    registry = replay_batches(spark, engine_config(TUMBLING, BOUNDED, offline=OFFLINE), root, batches)
    end_input(spark, registry)
    expected = OfflineDetector(30 * 60_000).process_batch(
        [("scooter-2", ts) for ts in tracks], 0, MAX_WATERMARK
    )
    assert [(e.status, e.event_time) for e in expected[0]] == [("offline", at("11:30:00"))]
    assert [(device, status, ms) for device, status, ms, _ in status_events(spark, registry)] == [
        ("scooter-2", "offline", at("11:30:00"))
    ]
    assert_reconciles(spark, registry, [record for batch in batches for record in batch])


def chunks(records: list[dict], size: int) -> list[list[dict]]:
    return [records[start : start + size] for start in range(0, len(records), size)]


def test_live_and_backfill_replays_give_the_status_events_of_a_batch_computation(spark, root):
    fleet = generate(
        FleetSpec(
            devices=6, partitions=3, seed=8, duration_ms=3 * 3_600_000, interval_ms=60_000, offline_ratio=0.03
        )
    )
    records = [generated.payload for generated in fleet]
    skewed = sorted(records, key=lambda record: record["partition"] == 0)  # partition 0 read last
    expected = batch_computation([(r["device_id"], r["ts"]) for r in records], 30 * 60_000)
    assert sum(status == "offline" for _, status, _ in expected) >= 5, (
        "the fleet must go offline now and then"
    )
    replays = {
        "live: small interleaved batches": chunks(records, 30),
        "backfill: large, skewed": chunks(skewed, 300),
    }
    for name, batches in replays.items():
        registry = replay_batches(
            spark, engine_config(TUMBLING, BOUNDED, offline=OFFLINE), root, batches, flush=True
        )
        events = [(device, status, ms) for device, status, ms, _ in status_events(spark, registry)]
        assert sorted(events) == expected, name
        assert spark.read.format("delta").load(registry.late_tracks.path).count() == 0, name
        buffered = (
            spark.read.format("delta").load(registry.offline_state.path).where("kind = 'buffered'").count()
        )
        assert buffered == 0, f"{name}: the flush must hand every buffered track"
        assert_reconciles(spark, registry, records)
