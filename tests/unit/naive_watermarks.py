"""A deliberately naive second implementation of the watermark rules (DESIGN §2):
the per-partition generators and the valve that combines them, written from their
definitions rather than as state machines. Every quantity after ``k`` batches is
recomputed from the first ``k`` batches alone (quadratic, and fine for tests).

The engine and the reference model share ``WatermarkTracker``, so a bug in it
would pass engine == model; the tests compare it with this instead."""

from __future__ import annotations

from dataclasses import dataclass, field

MIN = -(2**63)


@dataclass(frozen=True)
class Batch:
    """One micro-batch as the tracker sees it: processing time, partitions the
    source reported before it (declared), per sending partition its largest data
    timestamp and largest marker (either may be None), and the partitions with
    unread input."""

    now: int
    sent: dict[int, tuple[int | None, int | None]] = field(default_factory=dict)
    declared: frozenset[int] = frozenset()
    backlog: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Clock:
    watermark: int
    is_idle: bool
    is_aligned: bool


@dataclass(frozen=True)
class Rules:
    strategy: str  # bounded, monotonous or punctuated
    bound_ms: int
    idleness_ms: int | None


def partition_watermark(rules: Rules, batches: list[Batch], partition: int) -> int:
    """Bounded (and monotonous, bound 0): the largest data timestamp so far minus
    the bound minus 1 ms. Punctuated: the largest marker so far. -inf before any."""
    if rules.strategy == "punctuated":
        values = [sent[1] for b in batches if (sent := b.sent.get(partition)) and sent[1] is not None]
        return max(values, default=MIN)
    bound = rules.bound_ms if rules.strategy == "bounded" else 0
    values = [sent[0] - bound - 1 for b in batches if (sent := b.sent.get(partition)) and sent[0] is not None]
    return max(values, default=MIN)


def known_partitions(batches: list[Batch]) -> set[int]:
    return {p for b in batches for p in (*b.declared, *b.backlog, *b.sent)}


def last_heard(batches: list[Batch], partition: int) -> int:
    """When the partition last sent records, or else when it was first made known."""
    sending = [b.now for b in batches if partition in b.sent]
    if sending:
        return sending[-1]
    return next(b.now for b in batches if partition in b.declared or partition in b.backlog)


def is_idle(rules: Rules, batches: list[Batch], partition: int) -> bool:
    """Idle after the last batch: it sent nothing in it, has no unread input, and
    has been quiet for the idleness timeout."""
    last = batches[-1]
    if rules.idleness_ms is None or partition in last.sent or partition in last.backlog:
        return False
    return last.now - last_heard(batches, partition) >= rules.idleness_ms


def clocks(rules: Rules, batches: list[Batch]) -> tuple[int, dict[int, Clock]]:
    """The combined watermark and every partition's clock after ``batches``."""
    if not batches:
        return MIN, {}
    before, previous = clocks(rules, batches[:-1])
    last = batches[-1]
    result = {}
    for partition in known_partitions(batches):
        watermark = partition_watermark(rules, batches, partition)
        idle = is_idle(rules, batches, partition)
        was = previous.get(partition)
        if idle:
            aligned = False
        elif was is None:
            # New: a partition declared (or known by its backlog) before its records
            # holds the minimum at once; one first seen by its records must catch up.
            made_known = partition in last.declared or partition in last.backlog
            aligned = made_known or watermark >= before
        elif was.is_idle or not was.is_aligned:
            # Back from idleness, or still catching up.
            aligned = watermark >= before
        else:
            aligned = True
        result[partition] = Clock(watermark, idle, aligned)
    if not result:
        candidate = MIN
    elif all(clock.is_idle for clock in result.values()):
        candidate = max(clock.watermark for clock in result.values())
    else:
        holding = [c.watermark for c in result.values() if not c.is_idle and c.is_aligned]
        candidate = min(holding, default=MIN)
    return max(before, candidate), result
