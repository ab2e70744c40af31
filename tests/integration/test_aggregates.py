"""Every aggregate kind of the registry (``transforms.aggregates``) on tiny inline
DataFrames: its partial, merge, finish and gold rollup on the Spark side give
what the reference model's plain-Python value gives over the same values."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from spark_jobs.eventtime.measures import MEASURES, python_value
from spark_jobs.transforms.aggregates import (
    AGGREGATES,
    finished_measures,
    measure_rollups,
    merged_measures,
    partial_aggregates,
)

pytestmark = pytest.mark.spark


def test_every_measure_of_the_reference_model_has_its_spark_expressions():
    assert set(AGGREGATES) == set(MEASURES)


# Two windows' records of one key (None is a missing value), and all of them.
FIRST, SECOND = [3, None, 7], [7, 1, None, 12]
EVERY = FIRST + SECOND


def config(function: str) -> SimpleNamespace:
    return SimpleNamespace(measures={"v": (function,)}, schema={"v": "long"})


def expected(function: str, values: list) -> object:
    return python_value(function, [value for value in values if value is not None])


def partial(spark, function: str, values: list, alias: str):
    records = spark.createDataFrame([(value,) for value in values], "v long")
    return records.groupBy().agg(*partial_aggregates(config(function))).alias(alias)


def close_to(actual: object, value: object) -> bool:
    return actual == pytest.approx(value) if isinstance(value, float) else actual == value


@pytest.mark.parametrize("function", sorted(AGGREGATES))
def test_merging_two_partials_gives_the_aggregate_of_all_their_values(spark, function):
    first, second = partial(spark, function, FIRST, "t"), partial(spark, function, SECOND, "s")
    merged = first.crossJoin(second).select(
        *(column.alias(name) for name, column in merged_measures(config(function)).items())
    )
    row = merged.first()
    assert row.record_count == len(EVERY)
    assert close_to(row[f"v_{function}"], expected(function, EVERY))


@pytest.mark.parametrize("function", sorted(AGGREGATES))
def test_a_new_partial_finishes_as_the_aggregate_of_its_values(spark, function):
    finished = partial(spark, function, FIRST, "s").select(
        *(column.alias(name) for name, column in finished_measures(config(function)).items())
    )
    assert close_to(finished.first()[f"v_{function}"], expected(function, FIRST))


@pytest.mark.parametrize("function", sorted(AGGREGATES))
def test_the_gold_rollup_of_two_windows_gives_the_aggregate_of_all_their_values(spark, function):
    windows = [
        partial(spark, function, values, "s").select(
            *(column.alias(name) for name, column in finished_measures(config(function)).items())
        )
        for values in (FIRST, SECOND)
    ]
    rolled = windows[0].unionByName(windows[1]).groupBy().agg(*measure_rollups(config(function)))
    assert close_to(rolled.first()[f"v_{function}"], expected(function, EVERY))


def test_the_aggregates_of_no_values_are_null_except_the_counts():
    assert {function: python_value(function, []) for function in AGGREGATES} == {
        "count": 0,
        "sum": None,
        "min": None,
        "max": None,
        "avg": None,
        "approx_distinct": 0,
    }
