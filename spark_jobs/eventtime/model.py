"""The reference model: DESIGN §2 as a small, exact, pure-Python program.

It takes an arrival-ordered stream of records cut into micro-batches and
returns what the silver stage must produce: window results with their
revisions and statuses, every firing, the quarantined (record, window) pairs,
and the watermark after each batch. It is the oracle the Spark engine is
compared with, so it favours obviousness over speed.

Per batch, exactly as the engine does it:

1. every data record is judged against the pipeline watermark ``W`` as it
   stood when the batch started: for each window it belongs to, the pair goes
   to the quarantine if the window is cleaned (``W >= end - 1 + lateness``),
   otherwise it is added to the window;
2. every record (late or not) and every marker feeds its partition's
   generator; the valve combines the partition watermarks into ``W'``;
3. windows with ``W' >= end - 1`` fire: first firing is revision 1, and a fired
   window that received records in this batch fires again with revision + 1
   (accumulating: a firing carries the full result); windows with
   ``W' >= end - 1 + lateness`` are closed.

``run(..., flush=True)`` ends the input like a bounded source: one more step
moves the watermark to MAX_WATERMARK so that every window fires and closes.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spark_jobs.eventtime.generators import WatermarkSpec, quantile_timestamps
from spark_jobs.eventtime.measures import MEASURES, python_value
from spark_jobs.eventtime.tracker import PartitionInput, WatermarkTracker
from spark_jobs.eventtime.valve import ValveState
from spark_jobs.eventtime.windows import SessionSpec, Window, WindowSpec, is_cleaned, is_fired

OPEN, FIRED, CLOSED = "open", "fired", "closed"


@dataclass(frozen=True)
class Record:
    """One arrival. A ``marker`` record is not data: its ``timestamp`` is the
    watermark it carries (punctuated strategy)."""

    partition: Hashable
    timestamp: int
    payload: Mapping[str, Any] = field(default_factory=dict)
    marker: bool = False


@dataclass(frozen=True)
class Batch:
    """One micro-batch. ``backlog`` names partitions that still have unread input
    after it: they are never idle, and are known before their first record.
    ``partitions`` names the partitions the source reported with the batch (a
    Kafka topic's, including silent ones): declared before the batch is judged."""

    records: Sequence[Record]
    processing_time: int = 0
    backlog: frozenset = frozenset()
    partitions: frozenset = frozenset()


@dataclass(frozen=True)
class Rules:
    window: WindowSpec | SessionSpec
    watermark: WatermarkSpec
    allowed_lateness_ms: int = 0
    key: tuple[str, ...] = ()
    measures: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    partitions: tuple[Hashable, ...] = ()

    def __post_init__(self) -> None:
        if self.allowed_lateness_ms < 0:
            raise ValueError("allowed_lateness_ms must not be negative")
        for column, aggregates in self.measures.items():
            unknown = set(aggregates) - set(MEASURES)
            if unknown:
                raise ValueError(f"measure {column}: not mergeable: {sorted(unknown)}")

    def key_of(self, record: Record) -> tuple:
        return tuple(record.payload.get(column) for column in self.key)


@dataclass
class WindowResult:
    key: tuple
    window: Window
    record_count: int
    measures: dict[str, Any]
    revision: int
    status: str


@dataclass(frozen=True)
class Firing:
    batch: int
    key: tuple
    window: Window
    revision: int
    record_count: int
    measures: Mapping[str, Any]


@dataclass(frozen=True)
class QuarantinedPair:
    batch: int
    record: Record
    window: Window
    watermark: int

    @property
    def lateness_ms(self) -> int:
        return self.watermark - self.record.timestamp


@dataclass(frozen=True)
class BatchWatermark:
    """The pipeline watermark after a batch; counts are of (record, window) pairs."""

    batch: int
    watermark: int
    active_partitions: int
    idle_partitions: int
    on_time_count: int
    late_count: int


@dataclass
class ModelResult:
    windows: dict[tuple[tuple, Window], WindowResult]
    firings: list[Firing]
    quarantined: list[QuarantinedPair]
    history: list[BatchWatermark]

    @property
    def watermarks(self) -> list[int]:
        return [entry.watermark for entry in self.history]


@dataclass
class _WindowState:
    records: list[Record] = field(default_factory=list)
    revision: int = 0
    status: str = OPEN
    changed: bool = False


def aggregate(column: str, function: str, records: Sequence[Record]) -> Any:
    """Spark's semantics: nulls are ignored; min/max/sum/avg of nothing is null."""
    values = [r.payload.get(column) for r in records if r.payload.get(column) is not None]
    return python_value(function, values)


def summarize(records: Sequence[Record]) -> dict[Hashable, PartitionInput]:
    """A batch as the generators see it: per partition, the largest data timestamp
    and the largest marker (a bounded generator only ever needs the maximum), with
    the count, the smallest and the disorder quantiles' timestamps of its data for
    a custom generator."""
    data: dict[Hashable, list[int]] = {}
    markers: dict[Hashable, int] = {}
    for record in records:
        if record.marker:
            markers[record.partition] = max(markers.get(record.partition, record.timestamp), record.timestamp)
        else:
            data.setdefault(record.partition, []).append(record.timestamp)
    return {
        partition: PartitionInput(
            max(data[partition]) if partition in data else None,
            markers.get(partition),
            len(data.get(partition, ())),
            min(data[partition]) if partition in data else None,
            quantile_timestamps(data.get(partition, ())),
        )
        for partition in sorted({*data, *markers}, key=str)
    }


def measure_columns(measures: Mapping[str, Sequence[str]]) -> list[str]:
    return [f"{column}_{function}" for column, functions in measures.items() for function in functions]


class BatchSteps:
    """The step every reference model takes per micro-batch: judge the batch's
    records against the watermark at its start, advance the clock, then settle
    (fire and close) at the new watermark. Subclasses judge and settle."""

    def __init__(self, rules: Rules, start_time: int = 0) -> None:
        self.rules = rules
        self.tracker = WatermarkTracker(rules.watermark)
        self.tracker.declare(rules.partitions, start_time)
        self.quarantined: list[QuarantinedPair] = []
        self.history: list[BatchWatermark] = []

    def run(self, batches: Sequence[Batch], flush: bool = False) -> Any:
        for batch in batches:
            self.process(batch)
        if flush:
            self.flush()
        return self.result()

    def process(self, batch: Batch) -> BatchWatermark:
        index = len(self.history)
        self.tracker.declare(sorted(batch.partitions, key=str), batch.processing_time)
        on_time, late = self._judge(index, batch.records, self.tracker.watermark)
        state = self.tracker.advance(batch.processing_time, summarize(batch.records), batch.backlog)
        return self._step(index, state, on_time, late)

    def flush(self) -> BatchWatermark:
        """End the input like a bounded source: the watermark moves to the end of time."""
        return self._step(len(self.history), self.tracker.flush(), 0, 0)

    def _step(self, index: int, state: ValveState, on_time: int, late: int) -> BatchWatermark:
        self._settle(index, state.watermark)
        entry = BatchWatermark(
            index, state.watermark, state.active_partitions, state.idle_partitions, on_time, late
        )
        self.history.append(entry)
        return entry

    def _judge(self, index: int, records: Sequence[Record], watermark: int) -> tuple[int, int]:
        raise NotImplementedError

    def _settle(self, index: int, watermark: int) -> None:
        raise NotImplementedError

    def result(self) -> Any:
        raise NotImplementedError


class ReferencePipeline(BatchSteps):
    def __init__(self, rules: Rules, start_time: int = 0) -> None:
        if not isinstance(rules.window, WindowSpec):
            raise TypeError(
                "ReferencePipeline runs tumbling and sliding windows; ReferenceSessions, sessions"
            )
        super().__init__(rules, start_time)
        self.states: dict[tuple[tuple, Window], _WindowState] = {}
        self.firings: list[Firing] = []

    def _judge(self, index: int, records: Sequence[Record], watermark: int) -> tuple[int, int]:
        on_time = late = 0
        for record in records:
            if record.marker:
                continue
            key = self.rules.key_of(record)
            for window in self.rules.window.assign(record.timestamp):
                if is_cleaned(window, watermark, self.rules.allowed_lateness_ms):
                    self.quarantined.append(QuarantinedPair(index, record, window, watermark))
                    late += 1
                    continue
                state = self.states.setdefault((key, window), _WindowState())
                state.records.append(record)
                state.changed = True
                on_time += 1
        return on_time, late

    def _settle(self, index: int, watermark: int) -> None:
        for (key, window), state in sorted(
            self.states.items(), key=lambda item: (item[0][1], repr(item[0][0]))
        ):
            if (
                state.status != CLOSED
                and is_fired(window, watermark)
                and (state.changed or state.revision == 0)
            ):
                state.revision += 1
                state.status = FIRED
                self.firings.append(
                    Firing(index, key, window, state.revision, len(state.records), self._measures(state))
                )
            if state.status != CLOSED and is_cleaned(window, watermark, self.rules.allowed_lateness_ms):
                state.status = CLOSED
            state.changed = False

    def _measures(self, state: _WindowState) -> dict[str, Any]:
        return {
            f"{column}_{function}": aggregate(column, function, state.records)
            for column, functions in self.rules.measures.items()
            for function in functions
        }

    def result(self) -> ModelResult:
        windows = {
            slot: WindowResult(
                slot[0], slot[1], len(state.records), self._measures(state), state.revision, state.status
            )
            for slot, state in self.states.items()
        }
        return ModelResult(windows, list(self.firings), list(self.quarantined), list(self.history))


def run_reference(
    rules: Rules, batches: Sequence[Batch], flush: bool = False, start_time: int = 0
) -> ModelResult:
    """Run the reference model over ``batches`` from a fresh state."""
    return ReferencePipeline(rules, start_time).run(batches, flush)
