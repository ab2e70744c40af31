"""The live feed: telemetry sent as it happens (``tidemark generate --live``, the demo's feed)."""

import itertools
import json

import pytest

from spark_jobs.generator import (
    LIVE_LATE_DELAY_MS,
    LIVE_LEAD_MS,
    LIVE_SEGMENT_MS,
    FleetSpec,
    Generated,
    after_outage,
    feed_live,
    file_sender,
    fleet_of,
    generate,
    live_records,
    send_as_due,
)

FLEET = FleetSpec(devices=12, partitions=3, seed=4, start_ms=1_000_000, duration_ms=60_000, interval_ms=2_000)


class FakeClock:
    """Wall-clock seconds that move only when the feed sleeps."""

    def __init__(self, start_s: float) -> None:
        self.now = start_s

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_live_records_come_in_arrival_order_across_segments():
    arrivals = [record.arrival_ms for record in itertools.islice(live_records(FLEET), 2_000)]
    assert arrivals == sorted(arrivals)
    assert arrivals[-1] > FLEET.start_ms + 2 * FLEET.duration_ms  # more than one segment was read


def test_live_records_continue_every_device_into_the_next_segment():
    second = FLEET.start_ms + FLEET.duration_ms
    devices = {
        record.payload["device_id"]
        for record in itertools.islice(live_records(FLEET), 2_000)
        if record.payload and second <= record.payload["ts"] < second + FLEET.duration_ms
    }
    assert devices == {f"dev-{index:05d}" for index in range(FLEET.devices)}


def test_a_quiet_partition_is_quiet_in_every_other_segment_only():
    fleet = FleetSpec(**{**FLEET.__dict__, "quiet_partitions": 1})
    quiet = fleet.partitions - 1
    per_segment: dict[int, set[int]] = {}
    for record in itertools.islice(live_records(fleet), 3_000):
        if record.payload and not record.late:
            segment = (record.payload["ts"] - fleet.start_ms) // fleet.duration_ms
            offset = (record.payload["ts"] - fleet.start_ms) % fleet.duration_ms
            if offset >= fleet.duration_ms * 0.6:  # past the point where it goes quiet
                per_segment.setdefault(segment, set()).add(record.partition)
    assert quiet in per_segment[0]
    assert quiet not in per_segment[1]
    assert quiet in per_segment[2]


def test_send_as_due_sends_each_record_once_in_the_tick_its_arrival_has_come():
    clock = FakeClock(FLEET.start_ms / 1000)
    batches: list[tuple[float, list]] = []
    manifest = send_as_due(
        live_records(FLEET),
        lambda batch: batches.append((clock.now * 1000, batch)),
        until_ms=FLEET.start_ms + 30_000,
        clock=clock.time,
        sleep=clock.sleep,
    )
    sent = [record for _, batch in batches for record in batch]
    assert all(record.arrival_ms <= moment for moment, batch in batches for record in batch)
    assert all(record.arrival_ms > moment - 1_000 for moment, batch in batches[1:] for record in batch)
    # Ticks at 0, 1, ..., 29 s: the last sends what arrived by 29 s.
    last_tick = FLEET.start_ms + 29_000
    expected = list(itertools.takewhile(lambda r: r.arrival_ms <= last_tick, live_records(FLEET)))
    assert sent == expected
    assert manifest.records == len(expected)
    assert manifest.valid + sum(manifest.rejected.values()) == manifest.records


def test_a_stopped_feed_returns_what_it_sent():
    clock = FakeClock(FLEET.start_ms / 1000)
    sent: list = []
    manifest = send_as_due(
        live_records(FLEET),
        sent.extend,
        stopped=lambda: clock.now * 1000 >= FLEET.start_ms + 5_000,
        clock=clock.time,
        sleep=clock.sleep,
    )
    assert manifest.records == len(sent) > 0
    assert max(record.arrival_ms for record in sent) <= FLEET.start_ms + 4_000


def test_a_live_feed_starts_minutes_back_with_uploads_minutes_late():
    clock = FakeClock(5_000_000)
    sent: list = []
    fleet = FleetSpec(devices=20, partitions=2, seed=1, interval_ms=2_000, late_ratio=0.1)
    manifest = feed_live(fleet, sent.extend, duration_ms=LIVE_SEGMENT_MS, clock=clock.time, sleep=clock.sleep)
    fleet_sent = fleet_of(json.loads(json.dumps(manifest.live_fleet)))  # as the printed counts carry it
    assert fleet_sent.start_ms == 5_000_000_000 - LIVE_LEAD_MS and fleet_sent.devices == fleet.devices
    assert list(itertools.islice(live_records(fleet_sent), len(sent))) == sent
    first_event = min(record.payload["ts"] for record in sent if record.payload and "ts" in record.payload)
    assert 5_000_000_000 - LIVE_LEAD_MS <= first_event < 5_000_000_000 - LIVE_LEAD_MS + fleet.interval_ms
    delays = [record.arrival_ms - record.payload["ts"] for record in sent if record.late]
    assert delays and all(LIVE_LATE_DELAY_MS[0] <= delay <= LIVE_LATE_DELAY_MS[1] for delay in delays)


def test_the_file_sender_lands_a_file_per_batch_in_arrival_order(tmp_path):
    records = list(itertools.islice(live_records(FLEET), 30))
    send = file_sender(tmp_path, "json")
    send(records[:10])
    send(records[10:])
    files = sorted(tmp_path.iterdir(), key=lambda path: path.stat().st_mtime)
    assert [len(path.read_text().splitlines()) for path in files] == [10, 20]
    assert [line for path in files for line in path.read_text().splitlines()] == [r.line for r in records]
    assert files[0].stat().st_mtime < files[1].stat().st_mtime
    assert not list(tmp_path.glob(".*"))  # nothing half-written is left visible


def test_a_quiet_partition_goes_dark_and_sends_its_backlog_when_its_quiet_segment_ends():
    fleet = FleetSpec(
        **{**FLEET.__dict__, "quiet_partitions": 1, "late_ratio": 0.2, "late_delay_ms": (20_000, 100_000)}
    )  # some late uploads arrive a segment or more after the one they belong to
    quiet, start = fleet.partitions - 1, fleet.start_ms
    # Quiet segments are the odd ones of 60 s; the last track is before 30 s into one,
    # its last on-time record due 5 s (the bound) later.
    dark = [(start + 95_000, start + 120_000), (start + 215_000, start + 240_000)]

    def naive_arrival(record) -> int:
        for dark_from, dark_to in dark:
            if record.partition == quiet and dark_from <= record.arrival_ms < dark_to:
                return dark_to
        return record.arrival_ms

    horizon = start + 4 * fleet.duration_ms + 1  # the second backlog arrives at 4 segments
    plain = [
        record
        for index in range(5)
        for record in generate(
            FleetSpec(
                **{
                    **fleet.__dict__,
                    "seed": fleet.seed + index,
                    "start_ms": start + index * fleet.duration_ms,
                    "quiet_partitions": index % 2,
                }
            )
        )
    ]
    expected = sorted((naive_arrival(r), r.line) for r in plain if naive_arrival(r) < horizon)
    sent = list(itertools.takewhile(lambda r: r.arrival_ms < horizon, live_records(fleet)))

    assert sorted((r.arrival_ms, r.line) for r in sent) == expected
    assert [r.arrival_ms for r in sent] == sorted(r.arrival_ms for r in sent)
    for dark_from, dark_to in dark:
        assert not [r for r in sent if r.partition == quiet and dark_from <= r.arrival_ms < dark_to]
        backlog = [r for r in sent if r.partition == quiet and r.arrival_ms == dark_to]
        assert any(r.late for r in backlog)
    # Every record held back was late already: the on-time ones were all due before dark.
    held = [r for r in plain if naive_arrival(r) != r.arrival_ms and naive_arrival(r) < horizon]
    assert held and all(r.late for r in held)


@pytest.mark.parametrize(
    ("quiet_after", "moved"),
    [
        # Segments of 60 s from 0; the odd ones are quiet. Arrival -> arrival as sent.
        (0.0, {64_999: 64_999, 65_000: 120_000, 119_999: 120_000, 120_000: 120_000, 59_999: 59_999}),
        (0.5, {94_999: 94_999, 95_000: 120_000, 119_999: 120_000, 120_000: 120_000, 185_000: 185_000}),
        (1.0, {65_000: 65_000, 119_999: 119_999, 239_999: 239_999}),
        (0.5, {215_000: 240_000, 214_999: 214_999, 239_999: 240_000}),
    ],
)
def test_a_record_of_a_quiet_partition_is_held_from_the_bound_after_its_last_track_to_the_segment_end(
    quiet_after, moved
):
    template = FleetSpec(
        partitions=3, quiet_partitions=1, start_ms=0, duration_ms=60_000, quiet_after=quiet_after
    )
    for arrival, sent in moved.items():
        quiet = Generated(partition=2, arrival_ms=arrival, payload={}, line="{}", late=True)
        assert after_outage(template, quiet).arrival_ms == sent, arrival
        other = Generated(partition=1, arrival_ms=arrival, payload={}, line="{}", late=True)
        assert after_outage(template, other).arrival_ms == arrival
