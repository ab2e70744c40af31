"""Window assignment, firing and cleanup (DESIGN §2).

Windows are half-open ``[start, end)`` in epoch milliseconds. Following Flink's
code (which compares with ``<=`` everywhere): a window fires when
``watermark >= end - 1`` and is cleaned up when
``watermark >= end - 1 + allowed_lateness``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Window:
    start: int
    end: int

    @property
    def max_timestamp(self) -> int:
        return self.end - 1


@dataclass(frozen=True)
class WindowSpec:
    """Tumbling windows have ``slide_ms == size_ms``; sliding ones a smaller slide."""

    size_ms: int
    slide_ms: int
    offset_ms: int = 0

    def __post_init__(self) -> None:
        if self.size_ms <= 0 or self.slide_ms <= 0:
            raise ValueError("window size and slide must be positive")
        if self.slide_ms > self.size_ms:
            raise ValueError("window slide must not exceed its size")

    @classmethod
    def tumbling(cls, size_ms: int, offset_ms: int = 0) -> WindowSpec:
        return cls(size_ms, size_ms, offset_ms)

    @classmethod
    def sliding(cls, size_ms: int, slide_ms: int, offset_ms: int = 0) -> WindowSpec:
        return cls(size_ms, slide_ms, offset_ms)

    @property
    def is_tumbling(self) -> bool:
        return self.slide_ms == self.size_ms

    def assign(self, timestamp: int) -> list[Window]:
        """Every window containing ``timestamp``, latest start first (Flink's
        SlidingEventTimeWindows.assignWindows). Python's ``%`` is the floor-mod
        form, so negative timestamps land in the right window."""
        last_start = window_start(timestamp, self.slide_ms, self.offset_ms)
        windows = []
        start = last_start
        while start > timestamp - self.size_ms:
            windows.append(Window(start, start + self.size_ms))
            start -= self.slide_ms
        return windows

    def last_fired(self, watermark: int) -> Window:
        """The window with the latest end that has fired at ``watermark``
        (:func:`is_fired`): ends lie on the slide grid, and the last one fired
        ends at or before ``watermark + 1``."""
        start = window_start(watermark + 1 - self.size_ms, self.slide_ms, self.offset_ms)
        return Window(start, start + self.size_ms)


def window_start(timestamp: int, slide_ms: int, offset_ms: int) -> int:
    return timestamp - (timestamp - offset_ms) % slide_ms


def is_fired(window: Window, watermark: int) -> bool:
    return watermark >= window.max_timestamp


def is_cleaned(window: Window, watermark: int, allowed_lateness_ms: int) -> bool:
    return watermark >= window.max_timestamp + allowed_lateness_ms
