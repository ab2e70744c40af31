"""Event-time timers with buffered records: Bird's BufferedKeyedProcessFunction (seed 003).

Records are not handled on arrival. They wait in a per-key buffer until the
watermark passes them; then buffered records and due timers are handled
together in event-time order. So a timer at 18:00:25 always fires before a
buffered track at 18:00:32, whatever the micro-batch boundaries, and a backfill
gives the same events as live processing.

At equal timestamps a record is handled before a timer: a track that arrives
exactly ``timeout`` after the previous one keeps the device online.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

Key = Hashable

OFFLINE = "offline"
ONLINE = "online"

_RECORD, _TIMER = 0, 1


@dataclass(frozen=True, order=True)
class StatusEvent:
    event_time: int
    key: Key
    status: str
    watermark: int = field(compare=False)


@dataclass
class _KeyState:
    status: str | None = None
    timer: int | None = None
    buffer: list[int] = field(default_factory=list)


class OfflineDetector:
    """Emits OFFLINE at ``last_track + timeout`` when no track follows in time,
    and ONLINE at the next track of an offline key. A key's first track emits
    nothing. Tracks at or below the watermark when they arrive are late:
    :meth:`process_batch` returns them instead of handling them."""

    def __init__(self, timeout_ms: int) -> None:
        if timeout_ms <= 0:
            raise ValueError("timeout_ms must be positive")
        self.timeout_ms = timeout_ms
        self.states: dict[Key, _KeyState] = defaultdict(_KeyState)

    def process_batch(
        self, tracks: Iterable[tuple[Key, int]], watermark_before: int, watermark_after: int
    ) -> tuple[list[StatusEvent], list[tuple[Key, int]]]:
        late = []
        for key, timestamp in tracks:
            if timestamp <= watermark_before:
                late.append((key, timestamp))
            else:
                self.states[key].buffer.append(timestamp)
        return self.advance(watermark_after), late

    def advance(self, watermark: int) -> list[StatusEvent]:
        """Handle every buffered track and timer at or below ``watermark``."""
        events: list[StatusEvent] = []
        for key, state in self.states.items():
            due: list[tuple[int, int]] = [(ts, _RECORD) for ts in state.buffer if ts <= watermark]
            state.buffer = [ts for ts in state.buffer if ts > watermark]
            if state.timer is not None and state.timer <= watermark:
                due.append((state.timer, _TIMER))
            heapq.heapify(due)
            while due:
                timestamp, kind = heapq.heappop(due)
                if kind == _TIMER:
                    if timestamp != state.timer:
                        continue  # superseded by a later track
                    state.timer = None
                    state.status = OFFLINE
                    events.append(StatusEvent(timestamp, key, OFFLINE, watermark))
                    continue
                if state.status == OFFLINE:
                    events.append(StatusEvent(timestamp, key, ONLINE, watermark))
                state.status = ONLINE
                state.timer = timestamp + self.timeout_ms
                if state.timer <= watermark:
                    heapq.heappush(due, (state.timer, _TIMER))
        return sorted(events)
