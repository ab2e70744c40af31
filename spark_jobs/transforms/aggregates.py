"""Mergeable measures (DESIGN §3), one registry entry per aggregate kind.

An entry says everything about its kind: whether it needs a numeric column, the
type of its silver and gold column, the extra silver columns that keep it
mergeable (avg keeps its sum and count, approx_distinct an HLL sketch), the
partial aggregate of a window's records, the rule that merges two partials of the
same (window, key), the value of a new partial, the state of any number of states
(sessions merged into one; gold's rollup of windows), and the reference model's
plain-Python value. Nulls are ignored as in Spark's
aggregates: the sum, min, max or avg of nothing is null. Silver's windows write (new
records) and the late-merge job (quarantined records) both use
:func:`merged_measures`. A new aggregate is one entry in :data:`AGGREGATES`.

A partial takes the input column and its pipeline type name. In the other
expressions, ``part(suffix)`` is the column ``<column>_<function><suffix>``
of one side (the measure's value for ``""``, its state for a state suffix).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, DataType, DoubleType, FloatType, LongType

from spark_jobs.sql import column_of

if TYPE_CHECKING:
    from spark_jobs.config import PipelineConfig

Part = Callable[[str], Column]


@dataclass(frozen=True)
class Aggregate:
    value_type: Callable[[DataType], DataType]
    state: Mapping[str, DataType]
    partial: Callable[[Column, str], Mapping[str, Column]]
    merge: Callable[[Part, Part], Mapping[str, Column]]
    finish: Callable[[Part], Mapping[str, Column]]
    # The state of any number of rows' states, as aggregate expressions.
    combine: Callable[[Part], Mapping[str, Column]]


def _either(target: Column, source: Column, combine: Column) -> Column:
    """``combine`` of both sides, or the one that is not null."""
    return F.when(target.isNull(), source).when(source.isNull(), target).otherwise(combine)


def _sum_type(value_type: DataType) -> DataType:
    return DoubleType() if value_type in (DoubleType(), FloatType()) else LongType()


def _hll_input(column: Column, type_name: str) -> Column:
    # HLL sketches take integers, strings and binaries; other types go by their text.
    return column if type_name in ("int", "long", "string") else column.cast("string")


def _average(part: Part) -> Column:
    return part("_sum") / F.nullif(part("_n"), F.lit(0))


def _estimate(sketch: Column) -> Column:
    return F.coalesce(F.hll_sketch_estimate(sketch), F.lit(0))


def _merged_average(t: Part, s: Part) -> dict[str, Column]:
    total = _either(t("_sum"), s("_sum"), t("_sum") + s("_sum"))
    count = t("_n") + s("_n")
    return {"_sum": total, "_n": count, "": total / F.nullif(count, F.lit(0))}


def _merged_sketch(t: Part, s: Part) -> dict[str, Column]:
    sketch = _either(t("_sketch"), s("_sketch"), F.hll_union(t("_sketch"), s("_sketch")))
    return {"_sketch": sketch, "": _estimate(sketch)}


def _value(s: Part) -> dict[str, Column]:
    return {"": s("")}


# One per measure the reference model knows (eventtime.measures.MEASURES).
AGGREGATES: dict[str, Aggregate] = {
    "count": Aggregate(
        value_type=lambda _: LongType(),
        state={},
        partial=lambda column, _: {"": F.count(column)},
        merge=lambda t, s: {"": t("") + s("")},
        finish=_value,
        combine=lambda part: {"": F.sum(part(""))},
    ),
    "sum": Aggregate(
        value_type=_sum_type,
        state={},
        partial=lambda column, _: {"": F.sum(column)},
        merge=lambda t, s: {"": _either(t(""), s(""), t("") + s(""))},
        finish=_value,
        combine=lambda part: {"": F.sum(part(""))},
    ),
    "min": Aggregate(
        value_type=lambda value_type: value_type,
        state={},
        partial=lambda column, _: {"": F.min(column)},
        merge=lambda t, s: {"": F.least(t(""), s(""))},
        finish=_value,
        combine=lambda part: {"": F.min(part(""))},
    ),
    "max": Aggregate(
        value_type=lambda value_type: value_type,
        state={},
        partial=lambda column, _: {"": F.max(column)},
        merge=lambda t, s: {"": F.greatest(t(""), s(""))},
        finish=_value,
        combine=lambda part: {"": F.max(part(""))},
    ),
    "avg": Aggregate(
        value_type=lambda _: DoubleType(),
        state={"_sum": DoubleType(), "_n": LongType()},
        partial=lambda column, _: {"_sum": F.sum(column.cast("double")), "_n": F.count(column)},
        merge=_merged_average,
        finish=lambda s: {"_sum": s("_sum"), "_n": s("_n"), "": _average(s)},
        combine=lambda part: {"_sum": F.sum(part("_sum")), "_n": F.sum(part("_n"))},
    ),
    "approx_distinct": Aggregate(
        value_type=lambda _: LongType(),
        state={"_sketch": BinaryType()},
        partial=lambda column, type_name: {"_sketch": F.hll_sketch_agg(_hll_input(column, type_name))},
        merge=_merged_sketch,
        finish=lambda s: {"_sketch": s("_sketch"), "": _estimate(s("_sketch"))},
        combine=lambda part: {"_sketch": F.hll_union_agg(part("_sketch"), True)},
    ),
}


def _measures(config: PipelineConfig) -> list[tuple[str, str, Aggregate]]:
    """(input column, measure column, kind) of every configured measure."""
    return [
        (column, f"{column}_{function}", AGGREGATES[function])
        for column, functions in config.measures.items()
        for function in functions
    ]


def _side(alias: str | None, name: str) -> Part:
    if alias is None:
        return lambda suffix: F.col(name + suffix)
    return lambda suffix: column_of(alias, name + suffix)


def partial_aggregates(config: PipelineConfig) -> list[Column]:
    """Mergeable partials per (window, key), named as the silver columns."""
    columns = [F.count(F.lit(1)).alias("record_count")]
    for column, name, kind in _measures(config):
        partial = kind.partial(F.col(column), config.schema[column])
        columns += [expression.alias(name + suffix) for suffix, expression in partial.items()]
    return columns


def merged_measures(config: PipelineConfig, target: str = "t", source: str = "s") -> dict[str, Column]:
    """Silver column -> expression merging the target row with the source partial."""
    merged = {"record_count": column_of(target, "record_count") + column_of(source, "record_count")}
    for _, name, kind in _measures(config):
        merge = kind.merge(_side(target, name), _side(source, name))
        merged |= {name + suffix: expression for suffix, expression in merge.items()}
    return merged


def finished_measures(config: PipelineConfig, source: str = "s") -> dict[str, Column]:
    """Silver column -> expression for a partial inserted as a new row."""
    finished = {"record_count": column_of(source, "record_count")}
    for _, name, kind in _measures(config):
        finished |= {
            name + suffix: expression for suffix, expression in kind.finish(_side(source, name)).items()
        }
    return finished


def state_columns(config: PipelineConfig) -> list[str]:
    """The silver columns a partial fills and :func:`combined_measures` reads: the
    record count and each measure's state (its value, when that is its state)."""
    columns = ["record_count"]
    for _, name, kind in _measures(config):
        columns += [name + suffix for suffix in kind.state] or [name]
    return columns


def combined_measures(config: PipelineConfig) -> dict[str, Column]:
    """Silver column -> aggregate expression: the state and value of any number of rows'
    states (sessions merged into one, with the partials of their new records)."""
    combined = {"record_count": F.sum("record_count")}
    for _, name, kind in _measures(config):
        state = kind.combine(_side(None, name))
        combined |= {
            name + suffix: expression for suffix, expression in kind.finish(state.__getitem__).items()
        }
    return combined


def measure_rollups(config: PipelineConfig) -> list[Column]:
    """Gold's measures over silver windows, merged from each window's state."""
    return [
        kind.finish(kind.combine(_side(None, name)).__getitem__)[""].alias(name)
        for _, name, kind in _measures(config)
    ]


def measure_types(
    config: PipelineConfig, value_types: Mapping[str, DataType], with_state: bool
) -> dict[str, DataType]:
    """Measure column -> type, given each input column's type; ``with_state`` adds
    the columns that keep the measures mergeable (silver)."""
    types: dict[str, DataType] = {}
    for column, name, kind in _measures(config):
        types[name] = kind.value_type(value_types[column])
        if with_state:
            types |= {name + suffix: state_type for suffix, state_type in kind.state.items()}
    return types
