"""Combining partition watermarks: Flink's StatusWatermarkValve (DESIGN §2).

The pipeline watermark is the minimum over ACTIVE, ALIGNED partitions. A
partition is idle when it has produced no records for at least ``idleness`` of
processing time AND has no unread backlog, so a partition that is merely slow in
a backfill is never idle. Idle partitions are excluded; when every partition is
idle the watermark moves to the maximum of the partition watermarks. A
partition that becomes active again (or is first seen after the start) rejoins
the minimum only once its own watermark has caught up with the pipeline
watermark. The pipeline watermark never goes backwards.

The valve holds only per-partition clocks (a few numbers each), so the Spark
jobs run this very class on the driver: the oracle and production share one rule.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

from spark_jobs.eventtime.clock import MIN_WATERMARK

Partition = Hashable


@dataclass
class PartitionClock:
    """What the valve knows about one source partition."""

    watermark: int = MIN_WATERMARK
    last_data_at: int | None = None
    is_idle: bool = False
    is_aligned: bool = True


@dataclass(frozen=True)
class ValveState:
    """The combined watermark after an update, with the partition counts."""

    watermark: int
    active_partitions: int
    idle_partitions: int


class WatermarkValve:
    def __init__(self, idleness_ms: int | None, watermark: int = MIN_WATERMARK) -> None:
        if idleness_ms is not None and idleness_ms < 0:
            raise ValueError("idleness_ms must not be negative")
        self.idleness_ms = idleness_ms
        self.watermark = watermark
        self.clocks: dict[Partition, PartitionClock] = {}

    def declare(self, partitions: Iterable[Partition], now: int) -> None:
        """Make partitions known before their first record (a Kafka topic's
        partitions): they hold the minimum at -inf until they send data or go idle."""
        for partition in partitions:
            self.clocks.setdefault(partition, PartitionClock(last_data_at=now))

    def update(
        self,
        now: int,
        partition_watermarks: Mapping[Partition, int],
        backlog: Iterable[Partition] = (),
    ) -> ValveState:
        """Apply one micro-batch.

        ``partition_watermarks`` holds the emitted watermark of every partition
        that produced records in the batch; ``backlog`` names partitions with
        unread input; ``now`` is the batch's processing time in milliseconds.
        A backlogged partition not seen before is declared: it holds the minimum
        from now on, so a partition that is merely read late in a backfill does
        not find its records judged against the other partitions' progress.
        """
        backlogged = set(backlog)
        self.declare(sorted(backlogged - set(self.clocks), key=str), now)
        for partition, watermark in partition_watermarks.items():
            clock = self.clocks.get(partition)
            if clock is None:
                clock = self.clocks[partition] = PartitionClock(is_aligned=False)
            clock.watermark = max(clock.watermark, watermark)
            clock.last_data_at = now
            clock.is_idle = False
            clock.is_aligned = clock.is_aligned or clock.watermark >= self.watermark

        for partition, clock in self.clocks.items():
            if partition in partition_watermarks:
                continue
            quiet = self._is_quiet(clock, now) and partition not in backlogged
            if quiet and not clock.is_idle:
                clock.is_idle = True
            elif not quiet and clock.is_idle:
                # Back from idleness: judged as usual, but it only holds the
                # minimum again once its watermark has caught up.
                clock.is_idle = False
                clock.is_aligned = clock.watermark >= self.watermark
            if clock.is_idle:
                clock.is_aligned = False

        self.watermark = max(self.watermark, self._candidate())
        idle = sum(clock.is_idle for clock in self.clocks.values())
        return ValveState(self.watermark, len(self.clocks) - idle, idle)

    def _is_quiet(self, clock: PartitionClock, now: int) -> bool:
        if self.idleness_ms is None or clock.last_data_at is None:
            return False
        return now - clock.last_data_at >= self.idleness_ms

    def _candidate(self) -> int:
        clocks = list(self.clocks.values())
        if not clocks:
            return MIN_WATERMARK
        active = [clock for clock in clocks if not clock.is_idle]
        if not active:
            return max(clock.watermark for clock in clocks)
        aligned = [clock.watermark for clock in active if clock.is_aligned]
        return min(aligned) if aligned else MIN_WATERMARK
