"""Window assignment, firing and cleanup (DESIGN §2), and session extents (§2c).

Windows are half-open ``[start, end)`` in epoch milliseconds. Following Flink's
code (which compares with ``<=`` everywhere): a window fires when
``watermark >= end - 1`` and is cleaned up when
``watermark >= end - 1 + allowed_lateness``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Why bronze rejects a record of a session pipeline whose gap comes from a column.
GAP_MISSING, GAP_NOT_POSITIVE, GAP_ABOVE_MAX = "gap_missing", "gap_not_positive", "gap_above_max"


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


@dataclass(frozen=True)
class SessionSpec:
    """A fixed ``gap_ms``, or a per-record gap in ``gap_column`` (milliseconds)
    bounded by ``max_gap_ms``; with ``max_duration_ms``, no session runs across a
    multiple of it since the epoch (a *cut*), so none runs longer."""

    gap_ms: int | None = None
    gap_column: str | None = None
    max_gap_ms: int | None = None
    max_duration_ms: int | None = None

    def __post_init__(self) -> None:
        if (self.gap_ms is None) == (self.gap_column is None):
            raise ValueError("a session window has either a fixed gap or a gap column")
        if self.gap_ms is not None and self.gap_ms <= 0:
            raise ValueError("the session gap must be positive")
        if self.gap_column is not None and (self.max_gap_ms is None or self.max_gap_ms <= 0):
            raise ValueError("a gap column needs a positive max_gap")
        if self.max_duration_ms is not None and self.max_duration_ms <= 0:
            raise ValueError("the session max_duration must be positive")

    @classmethod
    def fixed(cls, gap_ms: int) -> SessionSpec:
        return cls(gap_ms=gap_ms)

    @classmethod
    def dynamic(cls, gap_column: str, max_gap_ms: int) -> SessionSpec:
        return cls(gap_column=gap_column, max_gap_ms=max_gap_ms)

    def rejection(self, payload: Mapping[str, Any]) -> str | None:
        """Why bronze rejects a record for its gap (None: it has a usable one)."""
        if self.gap_column is None:
            return None
        gap = payload.get(self.gap_column)
        if gap is None:
            return GAP_MISSING
        if gap <= 0:
            return GAP_NOT_POSITIVE
        if gap > self.max_gap_ms:
            return GAP_ABOVE_MAX
        return None

    def proto(self, timestamp: int, payload: Mapping[str, Any]) -> Window:
        """A record's own session ``[ts, ts + gap)``, ended at the next cut; only for a
        record not rejected."""
        gap = self.gap_ms if self.gap_column is None else payload[self.gap_column]
        if self.max_duration_ms is None:
            return Window(timestamp, timestamp + gap)
        return Window(timestamp, min(timestamp + gap, next_cut(timestamp, self.max_duration_ms)))


def next_cut(timestamp: int, every_ms: int) -> int:
    """The first multiple of ``every_ms`` after ``timestamp`` (floor-mod: negative
    timestamps too)."""
    return timestamp - timestamp % every_ms + every_ms


def at_cut(point: int, every_ms: int | None) -> bool:
    """Whether ``point`` is a cut (a multiple of ``every_ms``; never without one)."""
    return every_ms is not None and point % every_ms == 0


def touches(a: Window, b: Window, cut_every_ms: int | None = None) -> bool:
    """Flink's merge rule: intersecting or adjacent extents merge, except extents that
    meet at a cut (with ``max_duration``: extents end at the next cut, so two that meet
    there lie on either side of it)."""
    if a.end == b.start or b.end == a.start:
        return not at_cut(max(a.start, b.start), cut_every_ms)
    return a.start <= b.end and a.end >= b.start


def span(extents: Iterable[Window]) -> Window:
    extents = list(extents)
    return Window(min(e.start for e in extents), max(e.end for e in extents))


def touching_groups(extents: Sequence[Window], cut_every_ms: int | None = None) -> list[list[int]]:
    """Indexes of ``extents`` grouped by chains of touching extents (:func:`touches`),
    each group in order of start, the groups in order of their start."""
    order = sorted(range(len(extents)), key=lambda i: (extents[i].start, extents[i].end, i))
    groups: list[list[int]] = []
    reach = None
    for index in order:
        start = extents[index].start
        if reach is None or start > reach or (start == reach and at_cut(start, cut_every_ms)):
            groups.append([])
            reach = extents[index].end
        groups[-1].append(index)
        reach = max(reach, extents[index].end)
    return groups
