"""The page's charts as geometry: what to draw where, in SVG user units. The
template draws it (``templates/chart.html``), escaping every label.

- the combined watermark against processing time, a step line (a watermark holds
  between steps), with +inf (end of input) as a dashed rise into a band on top;
- each partition's lag behind the pipeline's watermark over time, a step line per
  partition (from the clocks every batch's last step keeps);
- the late share of each batch, a bar per batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from spark_jobs.tradeoff import tradeoff_points
from tidemark_airflow.lakehouse import EPOCH, MAX_WATERMARK, is_finite, lag_ms

PALETTE = ("#1b7bb8", "#d97706", "#059669", "#dc2626", "#7c3aed", "#db2777", "#4b5563", "#0891b2")
WIDTH, HEIGHT = 760, 220
LEFT, RIGHT, TOP, BOTTOM = 170, 20, 16, 40
INF_BAND = 28


@dataclass(frozen=True)
class Mark:
    x: float
    y: float
    tip: str


@dataclass(frozen=True)
class Series:
    name: str
    color: str
    path: str
    marks: tuple[Mark, ...] = ()


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    tip: str


@dataclass(frozen=True)
class Label:
    x: float
    y: float
    text: str
    anchor: str = "end"


@dataclass(frozen=True)
class Chart:
    title: str
    kind: str
    series: tuple[Series, ...] = ()
    bars: tuple[Bar, ...] = ()
    labels: tuple[Label, ...] = ()
    rises: tuple[tuple[float, float], ...] = ()  # (x, from y): a dashed rise to +inf
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    right: int = RIGHT
    top: int = TOP
    bottom: int = BOTTOM
    legend: tuple[tuple[str, str], ...] = field(default=())

    @property
    def axis_y(self) -> int:
        return self.height - self.bottom


def millis(moment: datetime) -> int:
    return (moment.astimezone(UTC) - EPOCH) // timedelta(milliseconds=1)


class Scale:
    """Maps a value range onto a pixel range (flat ranges map to the low end)."""

    def __init__(self, low: float, high: float, start: float, end: float) -> None:
        self.low, self.span, self.start, self.extent = low, (high - low) or 1, start, end - start

    def __call__(self, value: float) -> float:
        return round(self.start + (value - self.low) / self.span * self.extent, 1)


def _time_axis(
    moments: Sequence[datetime], x: Scale, height: int, fmt: Callable[[datetime], str]
) -> list[Label]:
    axis_y = height - BOTTOM
    ends = [Label(x(millis(moments[0])), axis_y + 16, fmt(moments[0]), "start")]
    if moments[-1] != moments[0]:
        ends.append(Label(x(millis(moments[-1])), axis_y + 16, fmt(moments[-1]), "end"))
    return [*ends, Label((LEFT + WIDTH - RIGHT) / 2, axis_y + 32, "processing time", "middle")]


def watermark_chart(
    history: Sequence[dict[str, Any]],
    fmt_time: Callable[[datetime], str],
    fmt_watermark: Callable[[int], str],
) -> Chart | None:
    """The watermark (y) against processing time (x); None without a finite one.
    -inf steps (before data) are not drawn."""
    steps = [(millis(row["processing_time"]), row["watermark"], row) for row in history]
    finite = [y for _, y, _ in steps if is_finite(y)]
    if not finite:
        return None
    ceiling = TOP + (INF_BAND if any(y == MAX_WATERMARK for _, y, _ in steps) else 0)
    x = Scale(steps[0][0], steps[-1][0], LEFT, WIDTH - RIGHT)
    y = Scale(min(finite), max(finite), HEIGHT - BOTTOM, ceiling)

    def tip(row: dict[str, Any]) -> str:
        return (
            f"batch {row['batch_id']} at {fmt_time(row['processing_time'])}: "
            f"watermark {fmt_watermark(row['watermark'])}; {row['active_partitions']} active, "
            f"{row['idle_partitions']} idle partitions; {row['on_time_count']} on time, "
            f"{row['late_count']} late"
        )

    path: list[str] = []
    marks: list[Mark] = []
    rises: list[tuple[float, float]] = []
    last_y: float | None = None
    for at, watermark, row in steps:
        if watermark == MAX_WATERMARK and last_y is not None:
            path.append(f"H{x(at)}")
            rises.append((x(at), last_y))
            marks.append(Mark(x(at), TOP, tip(row)))
        if not is_finite(watermark):
            continue
        path.append(f"M{x(at)},{y(watermark)}" if last_y is None else f"H{x(at)}V{y(watermark)}")
        last_y = y(watermark)
        marks.append(Mark(x(at), last_y, tip(row)))
    labels = [
        Label(LEFT - 6, y(max(finite)) + 4, fmt_watermark(max(finite))),
        Label(LEFT - 6, y(min(finite)) + 4, fmt_watermark(min(finite))),
        *_time_axis([row["processing_time"] for _, _, row in steps], x, HEIGHT, fmt_time),
        *([Label(LEFT - 6, TOP + 4, "+\u221e")] if rises else []),
    ]
    series = Series("watermark", PALETTE[0], "".join(path), tuple(marks))
    return Chart(
        "Watermark against processing time", "watermark", (series,), labels=tuple(labels), rises=tuple(rises)
    )


def lag_chart(
    history: Sequence[dict[str, Any]],
    fmt_time: Callable[[datetime], str],
    fmt_lag: Callable[[int], str],
) -> Chart | None:
    """How far each partition's watermark trails the pipeline's (:func:`lag_ms`;
    partitions ahead at the top, behind at the bottom), against processing time;
    None without two points with finite watermarks in the history."""
    points: dict[str, list[tuple[int, int, datetime]]] = {}
    for row in history:
        for clock in row.get("partition_clocks") or ():
            lag = lag_ms(row["watermark"], clock["partition_watermark"])
            if lag is not None:
                at = row["processing_time"]
                points.setdefault(clock["source_partition"], []).append((millis(at), lag, at))
    if sum(len(series) for series in points.values()) < 2:
        return None
    moments = sorted({at for series in points.values() for _, _, at in series})
    lags = [lag for series in points.values() for _, lag, _ in series]
    x = Scale(millis(moments[0]), millis(moments[-1]), LEFT, WIDTH - RIGHT)
    y = Scale(min(lags), max(lags), TOP, HEIGHT - BOTTOM)
    series = []
    for index, partition in enumerate(sorted(points, key=lambda p: (len(p), p))):
        path, marks = [], []
        for at, lag, moment in points[partition]:
            path.append(f"M{x(at)},{y(lag)}" if not path else f"H{x(at)}V{y(lag)}")
            marks.append(Mark(x(at), y(lag), f"partition {partition} at {fmt_time(moment)}: {fmt_lag(lag)}"))
        series.append(Series(partition, PALETTE[index % len(PALETTE)], "".join(path), tuple(marks)))
    labels = [
        Label(LEFT - 6, y(min(lags)) + 4, fmt_lag(min(lags))),
        Label(LEFT - 6, y(max(lags)) + 4, fmt_lag(max(lags))),
        *_time_axis(moments, x, HEIGHT, fmt_time),
    ]
    legend = tuple((s.name, s.color) for s in series)
    return Chart(
        "Partition lag behind the pipeline's watermark",
        "lag",
        tuple(series),
        labels=tuple(labels),
        legend=legend,
    )


def late_share_chart(history: Sequence[dict[str, Any]], fmt_time: Callable[[datetime], str]) -> Chart | None:
    """The share of each batch's records judged late (a bar per batch with
    records); None before any batch had records."""
    batches = [row for row in history if row["on_time_count"] + row["late_count"] > 0]
    if not batches:
        return None
    shares = [row["late_count"] / (row["on_time_count"] + row["late_count"]) for row in batches]
    top_share = max(max(shares), 0.01)
    y = Scale(0, top_share, HEIGHT - BOTTOM, TOP)
    slot = (WIDTH - LEFT - RIGHT) / len(batches)
    bars = []
    for index, (row, share) in enumerate(zip(batches, shares, strict=True)):
        total = row["on_time_count"] + row["late_count"]
        tip = (
            f"batch {row['batch_id']} at {fmt_time(row['processing_time'])}: "
            f"{row['late_count']} of {total} records late ({share:.1%})"
        )
        height = round(HEIGHT - BOTTOM - y(share), 1)
        bars.append(Bar(round(LEFT + index * slot, 1), y(share), round(max(slot * 0.8, 1), 1), height, tip))
    labels = [
        Label(LEFT - 6, TOP + 4, f"{top_share:.1%}"),
        Label(LEFT - 6, HEIGHT - BOTTOM + 4, "0 %"),
        Label(LEFT, HEIGHT - BOTTOM + 16, fmt_time(batches[0]["processing_time"]), "start"),
        Label(WIDTH - RIGHT, HEIGHT - BOTTOM + 16, fmt_time(batches[-1]["processing_time"]), "end"),
        Label((LEFT + WIDTH - RIGHT) / 2, HEIGHT - BOTTOM + 32, "batches, oldest first", "middle"),
    ]
    return Chart("Late share per batch", "late-share", bars=tuple(bars), labels=tuple(labels))


def tradeoff_chart(
    tuning: Sequence[dict[str, Any]], fmt_duration: Callable[[int], str], sessions: bool = False
) -> Chart | None:
    """``tidemark tune``'s trade-off for the pipeline's own history (its newest saved
    run): a point per candidate, the share of pairs late (y) against the median delay
    of a window's first firing after its end (x); for ``sessions``, of records late and
    of a session's first firing. None without a saved run that fired."""
    late, extent = ("records", "session") if sessions else ("pairs", "window")
    points = tradeoff_points(tuning)
    if not points:
        return None
    x = Scale(0, max(p.delay_ms for p in points) or 1, LEFT, WIDTH - RIGHT - 60)
    top = max(max(p.late_percent for p in points), 0.01)
    y = Scale(0, top, HEIGHT - BOTTOM, TOP)
    marks, labels = [], []
    for point in points:
        delay = fmt_duration(round(point.delay_ms))
        tip = (
            f"{point.label}: {point.late_percent:.2f} % of {late} late; fires {delay} after a {extent}'s end"
        )
        marks.append(Mark(x(point.delay_ms), y(point.late_percent), tip))
        labels.append(Label(x(point.delay_ms) + 6, y(point.late_percent) - 6, point.label, "start"))
    labels += [
        Label(LEFT - 6, TOP + 4, f"{top:.2f} %"),
        Label(LEFT - 6, HEIGHT - BOTTOM + 4, "0 %"),
        Label(LEFT, HEIGHT - BOTTOM + 16, fmt_duration(0), "start"),
        *(
            [Label(x(slowest), HEIGHT - BOTTOM + 16, fmt_duration(round(slowest)), "middle")]
            if (slowest := max(p.delay_ms for p in points)) > 0
            else []
        ),
        Label(
            (LEFT + WIDTH - RIGHT) / 2,
            HEIGHT - BOTTOM + 32,
            f"first firing after the {extent}'s end (median)",
            "middle",
        ),
    ]
    run = tuning[0]
    when = f"{run['tuned_at']:%Y-%m-%d %H:%M} UTC"
    title = f"Late {late} against firing delay (tidemark tune over {run['history']}, {when})"
    return Chart(
        title, "tradeoff", (Series("candidates", PALETTE[0], "", tuple(marks)),), labels=tuple(labels)
    )
