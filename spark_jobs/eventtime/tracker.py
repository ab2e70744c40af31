"""The pipeline clock: per-partition generators feeding the valve.

The reference model and the Spark silver job both advance the watermark through
this class, once per micro-batch, from a per-partition summary of the batch
(largest data timestamp, largest marker). The Spark job keeps it on the driver
between batches and records its partition clocks with every watermark step
(:mod:`spark_jobs.eventtime.clock_log`); the model keeps it in memory.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

from spark_jobs.eventtime.clock import MAX_WATERMARK, MIN_WATERMARK
from spark_jobs.eventtime.generators import PartitionGenerator, PartitionInput, WatermarkSpec
from spark_jobs.eventtime.valve import PartitionClock, ValveState, WatermarkValve


@dataclass(frozen=True)
class PartitionSnapshot:
    """One partition's clock as recorded with a watermark step and in ``ops.watermarks``."""

    partition: Hashable
    max_timestamp: int | None
    watermark: int
    last_data_at: int | None
    is_idle: bool
    is_aligned: bool
    generator_state: str | None = None  # a custom generator's snapshot(), as JSON text


class WatermarkTracker:
    def __init__(self, spec: WatermarkSpec, watermark: int = MIN_WATERMARK) -> None:
        self.spec = spec
        self.valve = WatermarkValve(spec.idleness_ms, watermark)
        self.generators: dict[Hashable, PartitionGenerator] = {}

    @property
    def watermark(self) -> int:
        return self.valve.watermark

    def restore(self, snapshot: PartitionSnapshot) -> None:
        self.generators[snapshot.partition] = PartitionGenerator.restored(
            self.spec, snapshot.max_timestamp, snapshot.watermark, snapshot.generator_state
        )
        self.valve.clocks[snapshot.partition] = PartitionClock(
            snapshot.watermark, snapshot.last_data_at, snapshot.is_idle, snapshot.is_aligned
        )

    def declare(self, partitions: Iterable[Hashable], now: int) -> None:
        """Partitions the source reports before their first record: each holds the
        watermark at -inf until it sends data or goes idle (its idleness counts from ``now``)."""
        self.valve.declare(partitions, now)

    def advance(
        self, now: int, inputs: Mapping[Hashable, PartitionInput], backlog: Iterable[Hashable] = ()
    ) -> ValveState:
        """Apply one micro-batch: feed each partition's generator, then the valve."""
        emitted = {}
        for partition, sent in inputs.items():
            generator = self.generators.get(partition)
            if generator is None:
                generator = self.generators[partition] = PartitionGenerator(self.spec)
            emitted[partition] = generator.advance(sent)
        return self.valve.update(now, emitted, backlog)

    def flush(self) -> ValveState:
        """End of input: the watermark moves to +inf (partition clocks stay as they are)."""
        self.valve.watermark = MAX_WATERMARK
        idle = sum(clock.is_idle for clock in self.valve.clocks.values())
        return ValveState(MAX_WATERMARK, len(self.valve.clocks) - idle, idle)

    def snapshots(self) -> list[PartitionSnapshot]:
        return [
            PartitionSnapshot(
                partition,
                generator.max_timestamp if generator else None,
                clock.watermark,
                clock.last_data_at,
                clock.is_idle,
                clock.is_aligned,
                generator.generator_state if generator else None,
            )
            for partition, clock in sorted(self.valve.clocks.items(), key=lambda item: str(item[0]))
            for generator in [self.generators.get(partition)]
        ]
