"""``tidemark tune``'s outputs: a table for the terminal, JSON, and the trade-off
chart (SVG): one point per candidate, the share of (record, window) pairs lost as
late against how long after a window's end it first fired (median, event time)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any

from pyspark.sql import SparkSession

from spark_jobs.engine.tuning import Outcome
from spark_jobs.lakehouse.create import create_if_missing
from spark_jobs.tables import tuning_table
from spark_jobs.tradeoff import tradeoff_points

HEADERS = (
    "candidate",
    "late pairs",
    "late %",
    "windows",
    "fired",
    "re-fired %",
    "at end",
    "delay p50",
    "delay p95",
    "batches p50",
    "batches p95",
)
# A session pipeline's table: a pair is a record, a window a session, and two more figures.
SESSION_HEADERS = (*HEADERS[:1], "late records", *HEADERS[2:3], "sessions", "split", "merged", *HEADERS[4:])


def seconds(milliseconds: float | None) -> str:
    return "-" if milliseconds is None else f"{milliseconds / 1000:.1f}s"


def number(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def table(outcomes: Sequence[Outcome], sessions: bool = False) -> str:
    """The candidates as an aligned text table."""
    rows = [
        (
            o.label,
            str(o.quarantined),
            f"{100 * o.late_share:.2f}",
            str(o.windows),
            *((str(o.split), str(o.merged)) if sessions else ()),
            str(o.fired),
            f"{100 * o.refire_share:.1f}",
            str(o.fired_at_end),
            seconds(o.delay_event_ms[0] if o.delay_event_ms else None),
            seconds(o.delay_event_ms[1] if o.delay_event_ms else None),
            number(o.delay_batches[0] if o.delay_batches else None),
            number(o.delay_batches[1] if o.delay_batches else None),
        )
        for o in outcomes
    ]
    headers = SESSION_HEADERS if sessions else HEADERS
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = [headers, *rows]
    return "\n".join(
        "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=True))
        )
        for line in lines
    )


def outcome_row(outcome: Outcome) -> dict[str, Any]:
    """One candidate's figures, flat: a JSON entry and an ``ops.tuning`` row alike."""
    event, batches = outcome.delay_event_ms or (None, None), outcome.delay_batches or (None, None)
    return {
        "candidate": outcome.label,
        "pairs": outcome.pairs,
        "late_pairs": outcome.quarantined,
        "late_share": outcome.late_share,
        "late_pairs_by_partition": outcome.quarantined_by_partition,
        "windows": outcome.windows,
        "fired": outcome.fired,
        "refired": outcome.refired,
        "refire_share": outcome.refire_share,
        "fired_at_end_of_input": outcome.fired_at_end,
        "delay_event_p50_ms": event[0],
        "delay_event_p95_ms": event[1],
        "delay_batches_p50": batches[0],
        "delay_batches_p95": batches[1],
        "split": outcome.split,
        "merged": outcome.merged,
    }


def as_json(outcomes: Sequence[Outcome]) -> str:
    return json.dumps([outcome_row(o) for o in outcomes], indent=2)


WIDTH, HEIGHT = 640, 400
LEFT, RIGHT, TOP, BOTTOM = 70, 30, 40, 50


def chart_svg(outcomes: Sequence[Outcome], title: str, late: str = "pairs") -> str:
    """Late share (y) against the median firing delay (x), a labelled point per
    candidate that fired a window before the end of input; ``late``: what the share
    is of (pairs, or a session pipeline's records)."""
    points = [
        (p.delay_ms, p.late_percent, p.label) for p in tradeoff_points([outcome_row(o) for o in outcomes])
    ]
    x_top = max([x for x, _, _ in points] + [1.0]) * 1.1
    y_top = max([y for _, y, _ in points] + [0.1]) * 1.1

    def at(x: float, y: float) -> tuple[float, float]:
        return (
            LEFT + x / x_top * (WIDTH - LEFT - RIGHT),
            HEIGHT - BOTTOM - y / y_top * (HEIGHT - TOP - BOTTOM),
        )

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="22" text-anchor="middle" font-size="14">{escape(title)}</text>',
        f'<path d="M{LEFT} {TOP} V{HEIGHT - BOTTOM} H{WIDTH - RIGHT}" fill="none" stroke="#333"/>',
        f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 12}" text-anchor="middle">'
        "firing delay after the window's end, median (event time)</text>",
        f'<text x="16" y="{(TOP + HEIGHT - BOTTOM) / 2}" text-anchor="middle" '
        f'transform="rotate(-90 16 {(TOP + HEIGHT - BOTTOM) / 2})">{late} late (%)</text>',
    ]
    for fraction in (0.0, 0.5, 1.0):
        delay, share = fraction * x_top / 1.1, fraction * y_top / 1.1
        x, y = at(delay, share)
        tick = escape(seconds(delay))
        parts.append(f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">{tick}</text>')
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{share:.2f}</text>')
    for delay, share, label in points:
        x, y = at(delay, share)
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="#1b7bb8"><title>{escape(label)}</title></circle>'
        )
        parts.append(f'<text x="{x + 8:.1f}" y="{y - 8:.1f}">{escape(label)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def save(
    spark: SparkSession, root: str | None, pipeline: str, outcomes: Sequence[Outcome], history: str
) -> str:
    """Append the figures to ``ops.tuning`` as one run (the page charts the newest);
    returns the run's id."""
    table = tuning_table(root)
    create_if_missing(spark, table)
    run_id, now = uuid.uuid4().hex, datetime.now(UTC)
    rows = [
        {"pipeline": pipeline, "run_id": run_id, "tuned_at": now, "history": history, **outcome_row(o)}
        for o in outcomes
    ]
    ordered = [tuple(row[name] for name in table.schema.fieldNames()) for row in rows]
    # A table saved before split and merged were figures gains them.
    frame = spark.createDataFrame(ordered, table.schema)
    frame.write.format("delta").mode("append").option("mergeSchema", "true").save(table.path)
    return run_id
