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
from collections.abc import Iterable, Mapping, Sequence
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
class SessionState:
    """A session's extent and lifecycle, without its records or measures (the model
    keeps its records beside it, the engine its measures in Spark)."""

    session_id: str
    extent: Window
    revision: int = 0
    status: str = OPEN
    merged_into: str | None = None
    changed: bool = False  # took records since it was last settled


@dataclass
class Merged:
    """What records joining a key's sessions made: the session each record joined
    (by its index), and the survivor each absorbed session merged into."""

    joined: dict[int, str] = field(default_factory=dict)
    absorbed: dict[str, str] = field(default_factory=dict)


@dataclass
class Judged(Merged):
    """:class:`Merged`, and the records quarantined, each with its extent."""

    late: list[tuple[int, Window]] = field(default_factory=list)


class KeySessions:
    """One key's sessions and the rules that change them: the reference model and the
    engine's micro-batch both run every key through one of these."""

    def __init__(
        self, key: tuple, sessions: Iterable[SessionState] = (), max_duration_ms: int | None = None
    ) -> None:
        self.key = key
        self.sessions = {session.session_id: session for session in sessions}
        self.max_duration_ms = max_duration_ms

    def tombstone(self) -> SessionState | None:
        """The key's closed session with the latest end."""
        closed = [s for s in self.sessions.values() if s.status == CLOSED]
        return max(closed, key=lambda s: (s.extent.end, s.session_id)) if closed else None

    def judge(self, arrivals: Sequence[Window], watermark: int, lateness_ms: int) -> Judged:
        """The key's records of one batch (their proto-sessions), judged together against
        the watermark at the batch's start; the counted ones join the sessions."""
        tombstone = self.tombstone()
        late: list[tuple[int, Window]] = []
        rest = []
        for index, proto in enumerate(arrivals):
            if tombstone is not None and touches(proto, tombstone.extent, self.max_duration_ms):
                late.append((index, span([proto, tombstone.extent])))
            else:
                rest.append(index)
        live = [s for s in self.sessions.values() if s.status in (OPEN, FIRED)]
        extents = [s.extent for s in live] + [arrivals[index] for index in rest]
        counted: dict[int, Window] = {}
        for group in touching_groups(extents, self.max_duration_ms):
            joining = [rest[i - len(live)] for i in group if i >= len(live)]
            if len(joining) == len(group) and is_cleaned(
                span(extents[i] for i in group), watermark, lateness_ms
            ):
                late += [(index, arrivals[index]) for index in joining]
            else:
                counted |= {index: arrivals[index] for index in joining}
        merged = self.merge(counted, live)
        return Judged(merged.joined, merged.absorbed, late)

    def merge(self, arrivals: Mapping[int, Window], sessions: Sequence[SessionState]) -> Merged:
        """``arrivals`` (proto-sessions by record index) join ``sessions`` (of this key):
        each group of touching extents becomes one session, the earliest-starting one
        surviving."""
        indexes = list(arrivals)
        extents = [s.extent for s in sessions] + [arrivals[index] for index in indexes]
        merged = Merged()
        for group in touching_groups(extents, self.max_duration_ms):
            members = [sessions[i] for i in group if i < len(sessions)]
            joining = [indexes[i - len(sessions)] for i in group if i >= len(sessions)]
            if not joining and len(members) == 1:
                continue
            extent = span(extents[i] for i in group)
            if members:
                survivor = min(members, key=lambda s: (s.extent.start, s.session_id))
            else:
                survivor = SessionState(session_id(self.key, extent.start), extent)
                self.sessions[survivor.session_id] = survivor
            for member in members:
                if member is not survivor:
                    member.status, member.merged_into, member.changed = MERGED, survivor.session_id, False
                    merged.absorbed[member.session_id] = survivor.session_id
            merged.joined |= dict.fromkeys(joining, survivor.session_id)
            survivor.extent, survivor.changed = extent, True
        return merged

    def settle(self, watermark: int, lateness_ms: int) -> list[SessionState]:
        """Fire what the watermark has passed (again, for a session that changed), put
        back to open a fired one extended past it, and close what it has cleaned.
        Returns the sessions fired, each with its new revision."""
        fired_now = []
        for session in self.sessions.values():
            if session.status == MERGED or (session.status == CLOSED and not session.changed):
                continue
            fired = is_fired(session.extent, watermark)
            if fired and (session.changed or session.status == OPEN):
                session.revision += 1
                fired_now.append(session)
            if is_cleaned(session.extent, watermark, lateness_ms):
                session.status = CLOSED
            else:
                session.status = FIRED if fired else OPEN
            session.changed = False
        return fired_now


class ReferenceSessions(BatchSteps):
    def __init__(self, rules: Rules, start_time: int = 0) -> None:
        if not isinstance(rules.window, SessionSpec):
            raise TypeError("ReferenceSessions runs session windows; ReferencePipeline runs the others")
        super().__init__(rules, start_time)
        self.spec: SessionSpec = rules.window
        self.keys: dict[tuple, KeySessions] = {}
        self.records: dict[str, list[Record]] = {}  # per session id
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
            sessions = self._key(key)
            alive = [s for s in sessions.sessions.values() if s.status != MERGED]
            self._place(sessions.merge(dict(enumerate(self._protos(records))), alive), records)
        self._settle(len(self.history) - 1, self.tracker.watermark)
        return len(pending)

    def _key(self, key: tuple) -> KeySessions:
        return self.keys.setdefault(key, KeySessions(key, max_duration_ms=self.spec.max_duration_ms))

    def _protos(self, records: Sequence[Record]) -> list[Window]:
        return [self.spec.proto(record.timestamp, record.payload) for record in records]

    def _place(self, merged: Merged, records: Sequence[Record]) -> None:
        """Records follow their sessions: an absorbed session's to its survivor (it keeps
        its own, as it was when absorbed), a joining record to the session it joined."""
        for absorbed, survivor in merged.absorbed.items():
            self.records.setdefault(survivor, []).extend(self.records.get(absorbed, []))
        for index, joined in merged.joined.items():
            self.records.setdefault(joined, []).append(records[index])

    def _judge(self, index: int, records: Sequence[Record], watermark: int) -> tuple[int, int]:
        arrivals: dict[tuple, list[Record]] = {}
        for record in records:
            if record.marker:
                continue
            reason = self.spec.rejection(record.payload)
            if reason is not None:
                self.rejected.append((record, reason))
            else:
                arrivals.setdefault(self.rules.key_of(record), []).append(record)
        on_time = late = 0
        for key, arrived in arrivals.items():
            judged = self._key(key).judge(self._protos(arrived), watermark, self.rules.allowed_lateness_ms)
            self._place(judged, arrived)
            for record_index, extent in sorted(judged.late):
                self.quarantined.append(QuarantinedPair(index, arrived[record_index], extent, watermark))
            on_time += len(judged.joined)
            late += len(judged.late)
        return on_time, late

    def _settle(self, index: int, watermark: int) -> None:
        fired = [
            session
            for sessions in self.keys.values()
            for session in sessions.settle(watermark, self.rules.allowed_lateness_ms)
        ]
        for session in sorted(fired, key=lambda s: (s.extent, s.session_id)):
            records = self.records[session.session_id]
            self.firings.append(
                SessionFiring(
                    index,
                    self.rules.key_of(records[0]),
                    session.session_id,
                    session.extent,
                    session.revision,
                    len(records),
                    self._measures(records),
                )
            )

    def _measures(self, records: Sequence[Record]) -> dict[str, Any]:
        return {
            f"{column}_{function}": aggregate(column, function, records)
            for column, functions in self.rules.measures.items()
            for function in functions
        }

    def result(self) -> SessionModelResult:
        sessions = {
            s.session_id: SessionResult(
                key,
                s.session_id,
                s.extent,
                len(self.records[s.session_id]),
                self._measures(self.records[s.session_id]),
                s.revision,
                s.status,
                s.merged_into,
            )
            for key, found in self.keys.items()
            for s in found.sessions.values()
        }
        return SessionModelResult(
            sessions, list(self.firings), list(self.quarantined), list(self.rejected), list(self.history)
        )
