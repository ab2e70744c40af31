"""The latency/accuracy trade-off of ``tidemark tune`` as chart points: one home for
what the command's SVG and the Watermarks page plot (no Spark here)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TradeoffPoint:
    """A candidate on the trade-off chart: its median firing delay (ms, event time)
    and the percentage of pairs it loses as late."""

    label: str
    delay_ms: float
    late_percent: float


def tradeoff_points(rows: Sequence[Mapping[str, Any]]) -> list[TradeoffPoint]:
    """The chart's points from rows of ``tidemark tune``'s figures (its JSON's or
    ``ops.tuning``'s): every candidate that fired a window before the end of input."""
    return [
        TradeoffPoint(row["candidate"], row["delay_event_p50_ms"], 100 * row["late_share"])
        for row in rows
        if row["delay_event_p50_ms"] is not None
    ]
