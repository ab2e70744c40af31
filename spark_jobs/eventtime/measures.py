"""The measures a pipeline may aggregate per window, as the reference model computes them:
each one's value over a window's non-null values, in plain Python. Their Spark
expressions (partials, merges, rollups) are :mod:`spark_jobs.transforms.aggregates`,
one per name here."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Measure:
    """``numeric_only``: defined for numeric columns only; ``python``: its value."""

    numeric_only: bool
    python: Callable[[Sequence[Any]], Any]


def _sum(values: Sequence[Any]) -> Any:
    return sum(values) if values else None


def _min(values: Sequence[Any]) -> Any:
    return min(values) if values else None


def _max(values: Sequence[Any]) -> Any:
    return max(values) if values else None


def _avg(values: Sequence[Any]) -> Any:
    return sum(values) / len(values) if values else None


MEASURES: dict[str, Measure] = {
    "count": Measure(numeric_only=False, python=len),
    "sum": Measure(numeric_only=True, python=_sum),
    "min": Measure(numeric_only=False, python=_min),
    "max": Measure(numeric_only=False, python=_max),
    "avg": Measure(numeric_only=True, python=_avg),
    "approx_distinct": Measure(numeric_only=False, python=lambda values: len(set(values))),
}


def python_value(function: str, values: Sequence[Any]) -> Any:
    """The reference model's value of ``function`` over the non-null ``values``."""
    return MEASURES[function].python(values)
