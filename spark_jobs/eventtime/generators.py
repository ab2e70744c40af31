"""Per-partition watermark generators (DESIGN §2, seeds 000-002).

A generator sees every record of its partition, on time or late, and is asked
for its watermark once per micro-batch (Flink's periodic emission with the
trigger interval as the period). Watermarks never go backwards.
"""

from __future__ import annotations

from dataclasses import dataclass

from spark_jobs.eventtime.clock import MIN_WATERMARK

STRATEGIES = ("bounded", "monotonous", "punctuated")


@dataclass(frozen=True)
class WatermarkSpec:
    """How each source partition derives its watermark, and when it counts as idle.

    ``max_out_of_orderness_ms`` only matters for ``bounded`` (``monotonous`` is
    bounded with 0). ``idleness_ms`` of ``None`` disables idle detection.
    """

    strategy: str = "bounded"
    max_out_of_orderness_ms: int = 0
    idleness_ms: int | None = None
    marker_column: str | None = None

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown watermark strategy {self.strategy!r}")
        if self.max_out_of_orderness_ms < 0:
            raise ValueError("max_out_of_orderness_ms must not be negative")

    @property
    def bound_ms(self) -> int:
        return self.max_out_of_orderness_ms if self.strategy == "bounded" else 0

    def watermark_for_max_timestamp(self, max_timestamp: int | None) -> int:
        """Flink's BoundedOutOfOrdernessWatermarks: ``max_ts - bound - 1``."""
        if max_timestamp is None:
            return MIN_WATERMARK
        return max_timestamp - self.bound_ms - 1


class PartitionGenerator:
    """Watermark generator of one source partition.

    ``bounded``/``monotonous`` track the largest timestamp seen; ``punctuated``
    takes the watermark carried by marker records (seed 002's
    MyPunctuatedGenerator) and ignores data timestamps.
    """

    def __init__(self, spec: WatermarkSpec) -> None:
        self.spec = spec
        self.max_timestamp: int | None = None
        self._watermark = MIN_WATERMARK

    @classmethod
    def restored(cls, spec: WatermarkSpec, max_timestamp: int | None, watermark: int) -> PartitionGenerator:
        """A generator as it stood when its state was saved."""
        generator = cls(spec)
        generator.max_timestamp = max_timestamp
        generator._watermark = watermark
        return generator

    def on_event(self, timestamp: int) -> None:
        if self.spec.strategy == "punctuated":
            return
        if self.max_timestamp is None or timestamp > self.max_timestamp:
            self.max_timestamp = timestamp

    def on_marker(self, watermark: int) -> None:
        if self.spec.strategy == "punctuated":
            self._watermark = max(self._watermark, watermark)

    def emit(self) -> int:
        """The watermark at the end of the current period (never decreasing)."""
        if self.spec.strategy != "punctuated":
            candidate = self.spec.watermark_for_max_timestamp(self.max_timestamp)
            self._watermark = max(self._watermark, candidate)
        return self._watermark
