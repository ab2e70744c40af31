"""Scooter telemetry (seed 003), deterministic from a seed, for demos, tests and benchmarks.

N devices are hashed to K partitions. Each device sends a track every
``interval`` (with jitter); some go offline for longer than the offline timeout.
Within a partition, records arrive at most ``bound`` out of order: a record's
arrival time is its event time plus a delay in [0, bound], and arrivals are
ordered by it, so every record is at most ``bound`` behind the partition's
latest. A share of records is truly late (a device that lost connectivity
uploads its backlog minutes later), some partitions go quiet part-way, and a
share of records is malformed, each labelled with the reject reason bronze must
give it. :class:`Manifest` says what was produced, so tests can reconcile.

:func:`live_feed` sends the same telemetry as it happens: records arrive at their
arrival time on the wall clock, segment after segment, until stopped.
"""

from __future__ import annotations

import contextlib
import csv
import heapq
import io
import itertools
import json
import os
import random
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from spark_jobs.object_store import is_object_store, pyarrow_filesystem

START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
FAR_FUTURE_MS = 221_845_392_000_000  # year 9000: valid, but beyond any future skew
REGIONS = ("north", "south", "east", "west")
FIELDS = ("device_id", "ts", "region", "battery", "speed", "partition")
MALFORMED_KINDS = (
    "malformed_record",
    "wrong_type",
    "missing_key",
    "missing_timestamp",
    "unparseable_timestamp",
    "timestamp_out_of_range",
    "future_timestamp",
    "missing_partition",
    "empty_record",
)


@dataclass(frozen=True)
class FleetSpec:
    devices: int = 50
    partitions: int = 4
    seed: int = 0
    start_ms: int = START_MS
    duration_ms: int = 3_600_000
    interval_ms: int = 10_000
    bound_ms: int = 5_000
    late_ratio: float = 0.0
    late_delay_ms: tuple[int, int] = (600_000, 1_800_000)
    offline_ratio: float = 0.002
    offline_gap_ms: tuple[int, int] = (2_100_000, 3_600_000)
    quiet_partitions: int = 0
    quiet_after: float = 0.5
    malformed_ratio: float = 0.0

    def __post_init__(self) -> None:
        if self.devices < 1 or self.partitions < 1:
            raise ValueError("devices and partitions must be at least 1")
        if not 0 <= self.quiet_partitions < self.partitions:
            raise ValueError("quiet_partitions must leave at least one partition sending")
        for name in ("late_ratio", "offline_ratio", "malformed_ratio", "quiet_after"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be between 0 and 1")


@dataclass(frozen=True)
class Generated:
    """One record in arrival order. ``reason`` is the reject reason bronze must give
    it (None for a valid record); ``late`` marks a valid record sent beyond the bound."""

    partition: int
    arrival_ms: int
    payload: dict | None
    line: str
    reason: str | None = None
    late: bool = False


@dataclass
class Manifest:
    records: int = 0
    valid: int = 0
    late: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    per_partition: dict[int, int] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    live_fleet: dict | None = None  # a live feed's first segment (live_template), as asdict gives it

    @classmethod
    def of(cls, records: Sequence[Generated]) -> Manifest:
        manifest = cls()
        manifest.add(records)
        return manifest

    def add(self, records: Sequence[Generated]) -> None:
        """Count ``records`` in as well."""
        self.records += len(records)
        self.valid += sum(r.reason is None for r in records)
        self.late += sum(r.late for r in records)
        reasons = Counter(self.rejected) + Counter(r.reason for r in records if r.reason)
        self.rejected = dict(sorted(reasons.items()))
        partitions = Counter(self.per_partition) + Counter(r.partition for r in records)
        self.per_partition = dict(sorted(partitions.items()))

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def partition_of(device_id: str, partitions: int) -> int:
    return zlib.crc32(device_id.encode()) % partitions


def is_quiet(spec: FleetSpec, partition: int) -> bool:
    """Whether ``partition`` is one of the ``spec.quiet_partitions`` that go quiet (the highest)."""
    return partition >= spec.partitions - spec.quiet_partitions


def quiet_from(spec: FleetSpec) -> int:
    """The event time from which the quiet partitions send no new tracks."""
    return spec.start_ms + int(spec.duration_ms * spec.quiet_after)


def _tracks(spec: FleetSpec, rng: random.Random) -> list[tuple[int, int, dict]]:
    """(arrival_ms, late, payload) for every valid track of the fleet."""
    end = spec.start_ms + spec.duration_ms
    jitter = spec.interval_ms // 10
    tracks = []
    for index in range(spec.devices):
        device = f"dev-{index:05d}"
        partition = partition_of(device, spec.partitions)
        region = REGIONS[zlib.crc32(device.encode()[::-1]) % len(REGIONS)]
        stop = quiet_from(spec) if is_quiet(spec, partition) else end
        battery = 100.0
        ts = spec.start_ms + rng.randrange(spec.interval_ms)
        while ts < stop:
            battery = max(0.0, battery - rng.random() * 0.2)
            payload = {
                "device_id": device,
                "ts": ts,
                "region": region,
                "battery": round(battery, 2),
                "speed": round(rng.random() * 25, 2),
                "partition": partition,
            }
            late = rng.random() < spec.late_ratio
            delay = rng.randint(*spec.late_delay_ms) if late else rng.randint(0, spec.bound_ms)
            tracks.append((ts + delay, late, payload))
            ts += spec.interval_ms + rng.randint(-jitter, jitter)
            if rng.random() < spec.offline_ratio:
                ts += rng.randint(*spec.offline_gap_ms)
    return tracks


def _malformed(kind: str, payload: dict) -> tuple[dict | None, str]:
    """A broken version of ``payload`` that bronze must reject with reason ``kind``."""
    broken = dict(payload)
    if kind == "malformed_record":
        return None, json.dumps(payload)[:-7]
    if kind == "empty_record":
        return None, ""
    if kind == "wrong_type":
        broken["battery"] = "full"
    elif kind == "missing_key":
        del broken["device_id"]
    elif kind == "missing_timestamp":
        del broken["ts"]
    elif kind == "unparseable_timestamp":
        broken["ts"] = "yesterday"
    elif kind == "timestamp_out_of_range":
        broken["ts"] = 10**18
    elif kind == "future_timestamp":
        broken["ts"] = FAR_FUTURE_MS
    elif kind == "missing_partition":
        del broken["partition"]
    return broken, json.dumps(broken)


def malformed_kinds(source_kind: str) -> tuple[str, ...]:
    """Kafka records carry their partition, so a missing partition field is no fault there."""
    return tuple(k for k in MALFORMED_KINDS if source_kind == "files" or k != "missing_partition")


def generate(spec: FleetSpec, kinds: Sequence[str] = MALFORMED_KINDS) -> list[Generated]:
    """The whole stream in arrival order (ties broken by partition, then event time)."""
    rng = random.Random(spec.seed)
    tracks = sorted(
        _tracks(spec, rng), key=lambda t: (t[0], t[2]["partition"], t[2]["ts"], t[2]["device_id"])
    )
    records = []
    for index, (arrival, late, payload) in enumerate(tracks):
        if rng.random() < spec.malformed_ratio:
            kind = kinds[index % len(kinds)]
            broken, line = _malformed(kind, payload)
            records.append(Generated(payload["partition"], arrival, broken, line, reason=kind))
        else:
            records.append(Generated(payload["partition"], arrival, payload, json.dumps(payload), late=late))
    return records


# Live: late uploads come minutes late (beyond a bound of seconds plus a lateness of
# half a minute, so they land in the quarantine), and a partition that goes quiet
# comes back with the next segment.
#
# A quiet partition's late uploads would keep arriving through its quiet stretch, and
# any record resets idleness (as in Flink): it would never go idle. So in the live
# feed it goes dark: from when its last on-time record is due to the segment's end,
# nothing of it arrives, and what would have arrived meanwhile comes as one backlog
# when it is back.
LIVE_SEGMENT_MS = 240_000
LIVE_LEAD_MS = 180_000
LIVE_LATE_DELAY_MS = (150_000, 300_000)


def live_records(template: FleetSpec, kinds: Sequence[str] = MALFORMED_KINDS) -> Iterator[Generated]:
    """Endless telemetry in arrival order from ``template.start_ms`` on: segment after
    segment of ``template.duration_ms``, each the template's fleet from a seed of
    its own; in every other segment ``template.quiet_partitions`` go quiet part-way
    and dark until the segment ends (:func:`after_outage`)."""
    pending: list[tuple[int, int, Generated]] = []
    order = itertools.count()
    for index in itertools.count():
        start = template.start_ms + index * template.duration_ms
        # Nothing arrives before its event time: what arrives before this segment starts is due.
        while pending and pending[0][0] < start:
            yield heapq.heappop(pending)[2]
        quiet = template.quiet_partitions if is_quiet_segment(index) else 0
        segment = replace(template, seed=template.seed + index, start_ms=start, quiet_partitions=quiet)
        for record in generate(segment, kinds):
            record = after_outage(template, record)
            heapq.heappush(pending, (record.arrival_ms, next(order), record))


def is_quiet_segment(index: int) -> bool:
    """Whether the live feed's segment ``index`` (from 0) is one where the quiet partitions go quiet."""
    return index % 2 == 1


def after_outage(template: FleetSpec, record: Generated) -> Generated:
    """``record`` as the live feed of ``template`` sends it: one of a quiet partition
    that would arrive while the partition is dark (in a quiet segment, from the bound
    after its last track on) arrives when the segment ends."""
    index = (record.arrival_ms - template.start_ms) // template.duration_ms
    if not is_quiet_segment(index) or not is_quiet(template, record.partition):
        return record
    segment = replace(template, start_ms=template.start_ms + index * template.duration_ms)
    if record.arrival_ms < quiet_from(segment) + template.bound_ms:
        return record
    return replace(record, arrival_ms=segment.start_ms + segment.duration_ms)


def send_as_due(
    records: Iterator[Generated],
    send: Callable[[list[Generated]], None],
    until_ms: float | None = None,
    stopped: Callable[[], bool] = lambda: False,
    tick_s: float = 1.0,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> Manifest:
    """Every ``tick_s``, send the records whose arrival time has come on the wall
    clock (as one batch; an empty tick sends nothing), until ``until_ms`` or until
    ``stopped()`` (checked between ticks, so a batch is never half sent or sent
    uncounted). What was sent, counted."""
    manifest = Manifest()
    upcoming = next(records)
    while not stopped() and (until_ms is None or clock() * 1000 < until_ms):
        now_ms = clock() * 1000
        due = []
        while upcoming.arrival_ms <= now_ms:
            due.append(upcoming)
            upcoming = next(records)
        if due:
            send(due)
            manifest.add(due)
        sleep(tick_s)
    return manifest


def live_template(spec: FleetSpec, start_ms: int) -> FleetSpec:
    """The first segment of a live feed of ``spec``'s fleet whose data starts at ``start_ms``."""
    return replace(spec, start_ms=start_ms, duration_ms=LIVE_SEGMENT_MS, late_delay_ms=LIVE_LATE_DELAY_MS)


def fleet_of(document: dict) -> FleetSpec:
    """The fleet ``asdict`` (or JSON) made ``document`` of."""
    pairs = {name: tuple(document[name]) for name in ("late_delay_ms", "offline_gap_ms")}
    return FleetSpec(**{**document, **pairs})


def feed_live(
    spec: FleetSpec,
    send: Callable[[list[Generated]], None],
    kinds: Sequence[str] = MALFORMED_KINDS,
    duration_ms: int | None = None,
    stopped: Callable[[], bool] = lambda: False,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> Manifest:
    """Send ``spec``'s fleet as it happens for ``duration_ms`` (None: until
    ``stopped()``). The data starts ``LIVE_LEAD_MS`` back, so windows fire from the
    first batch, and comes in segments of ``LIVE_SEGMENT_MS`` with late uploads
    ``LIVE_LATE_DELAY_MS`` late. What was sent is the first ``records`` of
    ``live_records(fleet_of(live_fleet), kinds)``."""
    now_ms = clock() * 1000
    template = live_template(spec, int(now_ms) - LIVE_LEAD_MS)
    until_ms = None if duration_ms is None else now_ms + duration_ms
    manifest = send_as_due(live_records(template, kinds), send, until_ms, stopped, clock=clock, sleep=sleep)
    manifest.live_fleet = asdict(template)
    return manifest


def file_sender(folder: str | Path, file_format: str) -> Callable[[list[Generated]], None]:
    """Send each batch of records as one file landed in ``folder`` (a local folder or
    an ``s3a://`` one)."""
    land, mtime = file_lander(folder, file_format, "live")
    landed = itertools.count()

    def send(batch: list[Generated]) -> None:
        nonlocal mtime
        mtime = max(mtime + 0.01, time.time())
        land(batch_lines(batch, file_format), mtime, next(landed))

    return send


@contextlib.contextmanager
def kafka_sender(bootstrap_servers: str, topic: str) -> Iterator[Callable[[list[Generated]], None]]:
    """Send each batch of records to the topic, every record to its own partition."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap_servers, acks="all", linger_ms=5)

    def send(batch: list[Generated]) -> None:
        for record in batch:
            producer.send(topic, record.line.encode("utf-8"), partition=record.partition)
        producer.flush()

    try:
        yield send
    finally:
        producer.close()


def as_csv_line(record: Generated) -> str:
    """The CSV form of a record: empty fields for missing ones; malformed JSON
    becomes a row with too many fields, an empty record stays empty."""
    if record.reason == "empty_record":
        return ""
    if record.payload is None:
        return "broken,row,with,too,many,fields,here"
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow(
        ["" if record.payload.get(f) is None else record.payload[f] for f in FIELDS]
    )
    return out.getvalue()


def chunk(records: Sequence[Generated], size: int) -> Iterable[Sequence[Generated]]:
    for start in range(0, len(records), size):
        yield records[start : start + size]


def landing_name(prefix: str, mtime: float, index: int, extension: str) -> str:
    """A landed file's name: its landing moment and index, so that names sort as files landed."""
    return f"{prefix}-{int(mtime * 1000)}-{index:06d}.{extension}"


def land_file(
    folder: Path, lines: Sequence[str], mtime: float, prefix: str, index: int, extension: str
) -> str:
    """Land ``lines`` as one file in ``folder`` atomically (written under a hidden
    name, then renamed), with modification time ``mtime``, named by it and ``index``."""
    name = landing_name(prefix, mtime, index, extension)
    hidden = folder / f".{name}.tmp"
    hidden.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.utime(hidden, (mtime, mtime))
    hidden.rename(folder / name)
    return str(folder / name)


def _next_mtime(folder: Path) -> float:
    """A modification time after every file already in ``folder`` and not before now."""
    existing = [p.stat().st_mtime for p in folder.iterdir() if p.is_file()]
    return max([time.time(), *(m + 0.01 for m in existing)])


def file_lander(
    folder: str | Path, extension: str, prefix: str
) -> tuple[Callable[[Sequence[str], float, int], str], float]:
    """How to land one file (its lines, landing moment and index) in ``folder``, a
    local folder or an ``s3a://`` one, and the first landing moment it may take."""
    if is_object_store(str(folder)):
        # A put is atomic, and the store sets the time (to the second): files of one
        # second are taken in name order, and names hold the landing moment.
        store, path = pyarrow_filesystem(str(folder))

        def put(lines: Sequence[str], moment: float, index: int) -> str:
            name = landing_name(prefix, moment, index, extension)
            with store.open_output_stream(f"{path}/{name}") as stream:
                stream.write(("\n".join(lines) + "\n").encode())
            return f"{str(folder).rstrip('/')}/{name}"

        return put, time.time()
    local = Path(folder)
    local.mkdir(parents=True, exist_ok=True)

    def write(lines: Sequence[str], moment: float, index: int) -> str:
        return land_file(local, lines, moment, prefix, index, extension)

    return write, _next_mtime(local)


def land_files(
    files: Iterable[Sequence[str]],
    folder: str | Path,
    extension: str,
    prefix: str = "part",
    rate: float | None = None,
) -> list[str]:
    """Land each list of lines as one file, in order. Each file appears atomically
    with a strictly increasing modification time, because Spark's file source
    takes files in mtime order. ``rate`` paces the files to that many lines per second."""
    land, mtime = file_lander(folder, extension, prefix)
    written = []
    started = time.monotonic()
    sent = 0
    for index, lines in enumerate(files):
        # Its landing moment (ingest_time), kept strictly after the previous file's.
        mtime = max(mtime, time.time())
        written.append(land(lines, mtime, index))
        mtime += 0.01
        sent += len(lines)
        if rate:
            time.sleep(max(0.0, sent / rate - (time.monotonic() - started)))
    return written


def write_landing(
    records: Sequence[Generated],
    folder: str | Path,
    records_per_file: int = 1_000,
    file_format: str = "json",
    rate: float | None = None,
    prefix: str = "part",
) -> list[str]:
    """Land generated records as files of ``records_per_file``, in arrival order."""
    return land_files(
        (batch_lines(batch, file_format) for batch in chunk(records, records_per_file)),
        folder,
        file_format,
        prefix,
        rate,
    )


def batch_lines(batch: Sequence[Generated], file_format: str) -> list[str]:
    """A file's lines for ``batch``: JSON lines, or CSV with its header."""
    if file_format == "csv":
        return [",".join(FIELDS), *(as_csv_line(r) for r in batch)]
    return [r.line for r in batch]


def send_to_kafka(
    records: Sequence[Generated], bootstrap_servers: str, topic: str, rate: float | None = None
) -> None:
    """Produce each record to its own partition, in arrival order."""
    started = time.monotonic()
    sent = 0
    with kafka_sender(bootstrap_servers, topic) as send:
        for batch in chunk(records, 100):
            send(list(batch))
            sent += len(batch)
            if rate:
                time.sleep(max(0.0, sent / rate - (time.monotonic() - started)))
