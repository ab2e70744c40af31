"""Session windows (DESIGN §2c) in the reference model: small, exact, pure Python.

A record at ``ts`` with gap ``g`` is the proto-session ``[ts, ts + g)``. Sessions of
one key merge when they intersect or touch (Flink's rule), and a session runs from
its earliest ``ts`` to the largest ``ts + g`` of its records. Firing and cleanup are
the windows' (:func:`~spark_jobs.eventtime.windows.is_fired`,
:func:`~spark_jobs.eventtime.windows.is_cleaned`) applied to a session's extent.

Per batch, every data record is judged against the watermark ``W`` as it stood when
the batch started, the batch's records together (so the order within a batch does
not matter):

1. a record that touches its key's tombstone (below) goes to the quarantine, with
   the extent it would have had merged with it;
2. the rest of a key's records and its open and fired sessions form groups of
   touching extents. A group with no session that is already cleaned on its own
   goes to the quarantine a record at a time (each with its own extent); any other
   group is one session: the earliest-starting session of the group keeps its id,
   the others become ``merged`` into it, and its records are counted.

Then the watermark advances and, as for windows, sessions fire (revision + 1 each
time one that changed is fired again; one extended past the watermark goes back to
``open``) and close.

A key's tombstone is its closed session with the latest end, kept as long as it is
the latest: one per key. That is enough for no session ever to overlap a closed one.
A session that is not cleaned ends after every closed one of its key, so a record or
chain of records that reaches it from an earlier closed session covers the latest
one, and a record that touches only earlier ones forms a group that is cleaned. A
tombstone forgotten by time would not do: records of one batch can chain from a
closed session's end to past the watermark.

:meth:`ReferenceSessions.fold_late` is the merge job: it folds the quarantined
records back in, extending, bridging and reopening sessions, after which the
sessions equal a batch sessionization of every record.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spark_jobs.eventtime.model import (
    CLOSED,
    FIRED,
    OPEN,
    BatchSteps,
    BatchWatermark,
    QuarantinedPair,
    Record,
    Rules,
    aggregate,
)
from spark_jobs.eventtime.windows import (
    SessionSpec,
    Window,
    is_cleaned,
    is_fired,
    span,
    touches,
    touching_groups,
)

MERGED = "merged"
SESSION_CLOSED = "session_closed"


def session_id(key: tuple, start: int) -> str:
    """A session's id, from its key and its start when it was created: unique per key
    while the session lives, because any later session created at that start would
    touch it."""
    return json.dumps([list(key), start], separators=(",", ":"), default=str)


@dataclass
class SessionResult:
    key: tuple
    session_id: str
    extent: Window
    record_count: int
    measures: dict[str, Any]
    revision: int
    status: str
    merged_into: str | None


@dataclass(frozen=True)
class SessionFiring:
    batch: int
    key: tuple
    session_id: str
    extent: Window
    revision: int
    record_count: int
    measures: Mapping[str, Any]


@dataclass
class SessionModelResult:
    sessions: dict[str, SessionResult]
    firings: list[SessionFiring]
    quarantined: list[QuarantinedPair]  # ``window``: the extent; the reason is SESSION_CLOSED
    rejected: list[tuple[Record, str]]
    history: list[BatchWatermark]

    def live(self) -> dict[tuple, list[SessionResult]]:
        """Sessions not merged into another, per key, in order of start."""
        found: dict[tuple, list[SessionResult]] = {}
        for result in sorted(self.sessions.values(), key=lambda s: (s.extent, s.session_id)):
            if result.status != MERGED:
                found.setdefault(result.key, []).append(result)
        return found


@dataclass
class _Session:
    session_id: str
    key: tuple
    extent: Window
    records: list[Record] = field(default_factory=list)
    revision: int = 0
    status: str = OPEN
    merged_into: str | None = None
    changed: bool = False


class ReferenceSessions(BatchSteps):
    def __init__(self, rules: Rules, start_time: int = 0) -> None:
        if not isinstance(rules.window, SessionSpec):
            raise TypeError("ReferenceSessions runs session windows; ReferencePipeline runs the others")
        super().__init__(rules, start_time)
        self.spec: SessionSpec = rules.window
        self.sessions: dict[str, _Session] = {}
        self.firings: list[SessionFiring] = []
        self.folded = 0  # how many of the quarantined the merge has folded in
        self.rejected: list[tuple[Record, str]] = []

    def fold_late(self) -> int:
        """The merge job: every quarantined record not folded yet joins the sessions it
        touches (closed ones too) and the other quarantined records it touches; the
        sessions it changed are settled at the current watermark (a fired or closed one
        gets its next revision). Returns how many records it folded."""
        pending = self.quarantined[self.folded :]
        self.folded = len(self.quarantined)
        by_key: dict[tuple, list[Record]] = {}
        for pair in pending:
            by_key.setdefault(self.rules.key_of(pair.record), []).append(pair.record)
        for key, records in by_key.items():
            self._merge(key, records, [s for s in self._of(key) if s.status != MERGED])
        self._settle(len(self.history) - 1, self.tracker.watermark)
        return len(pending)

    def _of(self, key: tuple) -> list[_Session]:
        return [s for s in self.sessions.values() if s.key == key]

    def _tombstone(self, key: tuple) -> _Session | None:
        closed = [s for s in self._of(key) if s.status == CLOSED]
        return max(closed, key=lambda s: s.extent.end) if closed else None

    def _judge(self, index: int, records: Sequence[Record], watermark: int) -> tuple[int, int]:
        lateness = self.rules.allowed_lateness_ms
        arrivals: dict[tuple, list[Record]] = {}
        late = 0
        for record in records:
            if record.marker:
                continue
            reason = self.spec.rejection(record.payload)
            if reason is not None:
                self.rejected.append((record, reason))
                continue
            key, proto = self.rules.key_of(record), self.spec.proto(record.timestamp, record.payload)
            tombstone = self._tombstone(key)
            if tombstone is not None and touches(proto, tombstone.extent):
                self.quarantined.append(
                    QuarantinedPair(index, record, span([proto, tombstone.extent]), watermark)
                )
                late += 1
            else:
                arrivals.setdefault(key, []).append(record)
        on_time = 0
        for key, arrived in arrivals.items():
            live = [s for s in self._of(key) if s.status in (OPEN, FIRED)]
            extents = [s.extent for s in live] + [self.spec.proto(r.timestamp, r.payload) for r in arrived]
            for group in touching_groups(extents):
                sessions = [live[i] for i in group if i < len(live)]
                joining = [arrived[i - len(live)] for i in group if i >= len(live)]
                if not sessions and is_cleaned(span(extents[i] for i in group), watermark, lateness):
                    for record in joining:
                        proto = self.spec.proto(record.timestamp, record.payload)
                        self.quarantined.append(QuarantinedPair(index, record, proto, watermark))
                    late += len(joining)
                    continue
                self._merge(key, joining, sessions)
                on_time += len(joining)
        return on_time, late

    def _merge(self, key: tuple, records: Sequence[Record], sessions: Sequence[_Session]) -> None:
        """``records`` join ``sessions`` (all of one key): each group of touching extents
        becomes one session, the earliest-starting one surviving."""
        extents = [s.extent for s in sessions] + [self.spec.proto(r.timestamp, r.payload) for r in records]
        for group in touching_groups(extents):
            members = [sessions[i] for i in group if i < len(sessions)]
            joining = [records[i - len(sessions)] for i in group if i >= len(sessions)]
            if not joining and len(members) == 1:
                continue
            extent = span(extents[i] for i in group)
            if members:
                survivor = min(members, key=lambda s: (s.extent.start, s.session_id))
            else:
                survivor = _Session(session_id(key, extent.start), key, extent)
                self.sessions[survivor.session_id] = survivor
            for absorbed in members:
                if absorbed is not survivor:
                    survivor.records.extend(absorbed.records)
                    absorbed.status, absorbed.merged_into, absorbed.changed = (
                        MERGED,
                        survivor.session_id,
                        False,
                    )
            survivor.records.extend(joining)
            survivor.extent, survivor.changed = extent, True

    def _settle(self, index: int, watermark: int) -> None:
        """Fire what the watermark has passed (again, for a session that changed), put
        back to open a fired one extended past it, and close what it has cleaned."""
        lateness = self.rules.allowed_lateness_ms
        for session in sorted(self.sessions.values(), key=lambda s: (s.extent, s.session_id)):
            if session.status == MERGED or (session.status == CLOSED and not session.changed):
                continue
            fired = is_fired(session.extent, watermark)
            if fired and (session.changed or session.status == OPEN):
                session.revision += 1
                self.firings.append(
                    SessionFiring(
                        index,
                        session.key,
                        session.session_id,
                        session.extent,
                        session.revision,
                        len(session.records),
                        self._measures(session.records),
                    )
                )
            if is_cleaned(session.extent, watermark, lateness):
                session.status = CLOSED
            else:
                session.status = FIRED if fired else OPEN
            session.changed = False

    def _measures(self, records: Sequence[Record]) -> dict[str, Any]:
        return {
            f"{column}_{function}": aggregate(column, function, records)
            for column, functions in self.rules.measures.items()
            for function in functions
        }

    def result(self) -> SessionModelResult:
        sessions = {
            s.session_id: SessionResult(
                s.key,
                s.session_id,
                s.extent,
                len(s.records),
                self._measures(s.records),
                s.revision,
                s.status,
                s.merged_into,
            )
            for s in self.sessions.values()
        }
        return SessionModelResult(
            sessions, list(self.firings), list(self.quarantined), list(self.rejected), list(self.history)
        )
