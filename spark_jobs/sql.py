"""Column references built from names, quoted so that no name is ever read as SQL.

Names from pipeline files are validated (``spark_jobs.config``); quoting them as
well keeps a name a name wherever it is interpolated. SQL text itself quotes with
``spark_jobs.catalog.quote_identifier`` and ``string_literal``.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import reduce
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.classic.column import Column as JvmColumn
from pyspark.sql.types import (
    ArrayType,
    DataType,
    DateType,
    IntegerType,
    LongType,
    StructField,
    StructType,
    TimestampType,
    _parse_datatype_string,
)

from spark_jobs.jvm import java_class


def quote_identifier(name: str) -> str:
    """A Spark SQL identifier in backticks (a backtick inside is doubled)."""
    return "`" + name.replace("`", "``") + "`"


def string_literal(value: str) -> str:
    """A Spark SQL string literal (quotes and backslashes escaped)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def is_in_sql(column: str, values: Iterable[str]) -> str:
    """SQL: ``column`` (a name or an ``alias.name`` from code, not from a user) is one of ``values``."""
    return f"{column} IN ({', '.join(map(string_literal, values))})"


def timestamp_literal(moment: datetime) -> str:
    """A Spark SQL timestamp literal of an aware ``moment``, in UTC to the microsecond."""
    return f"TIMESTAMP'{moment.astimezone(UTC).strftime('%Y-%m-%d %H:%M:%S.%f')}Z'"


def value_literal(value: object) -> str:
    """A Spark SQL literal of a column value as Spark collects it (not null)."""
    if isinstance(value, str):
        return string_literal(value)
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, datetime):  # collected naive, in the local time zone
        return timestamp_literal(value)
    if isinstance(value, date):
        return f"DATE'{value.isoformat()}'"
    raise TypeError(f"no SQL literal for {value!r}")


def all_equal_sql(columns: Sequence[str], values: Sequence[object]) -> str:
    """SQL: each of ``columns`` equals its value of ``values`` (none null)."""
    return " AND ".join(
        f"{quote_identifier(column)} = {value_literal(value)}"
        for column, value in zip(columns, values, strict=True)
    )


def column_of(alias: str, name: str) -> Column:
    """``alias.name`` (a MERGE's ``t``/``s``, a join's side) as a Column."""
    return F.col(f"{alias}.{quote_identifier(name)}")


def null_safe_match(columns: Iterable[str], target: str = "t", source: str = "s") -> Column:
    """A MERGE condition: every column equal in target and source, nulls included."""
    return reduce(operator.and_, (column_of(target, c).eqNullSafe(column_of(source, c)) for c in columns))


def local_rows(spark: SparkSession, rows: Sequence[Sequence[object]], schema: StructType | str) -> DataFrame:
    """A DataFrame of driver-side rows typed by ``schema``, parsed in the JVM from
    one JSON literal: timestamps travel as epoch microseconds (a naive datetime is
    local time, as ``createDataFrame`` reads it), dates as days since the epoch, and
    a value of the wrong type fails the query. ``createDataFrame`` goes through a
    pickled RDD instead, which makes a one-row Delta append cost more; Tidemark writes
    such rows on every micro-batch."""
    struct = schema if isinstance(schema, StructType) else _parse_datatype_string(schema)
    codecs = [_CODECS.get(type(f.dataType), _AS_IS) for f in struct.fields]
    wire = StructType(
        [
            StructField(f.name, codec.wire or f.dataType)
            for f, codec in zip(struct.fields, codecs, strict=True)
        ]
    )
    text = json.dumps(
        [
            {
                f.name: None if value is None else codec.encode(value)
                for f, codec, value in zip(struct.fields, codecs, row, strict=True)
            }
            for row in rows
        ]
    )
    # One partition: Spark's default splits a one-row range over every core, and a
    # write or broadcast of it runs a task per split, the rest empty.
    single = spark.range(0, 1, 1, numPartitions=1)
    parsed = single.select(F.inline(F.from_json(F.lit(text), ArrayType(wire), {"mode": "FAILFAST"})))
    return parsed.select(
        *(
            codec.decode(F.col(f.name)).cast(f.dataType).alias(f.name)
            for f, codec in zip(struct.fields, codecs, strict=True)
        )
    )


def compiled_from_json(text: Column, schema: str, options: dict[str, str]) -> Column:
    """``F.from_json(text, schema, options)``, the same expression, behind a Java
    function that Spark's compiled code calls (``io.tidemark.sql.FromJson``).

    Spark evaluates ``from_json`` interpreted only, and a projection that holds it is
    left out of whole-stage code generation: every column of every row is copied into
    a row of its own there, whether the row evaluates the parse or not. Worth it where
    few rows reach the parse (a ``CASE WHEN``): those pay a conversion of the result
    to Java values and back."""
    spark = SparkSession.active()
    jvm_from_json = java_class(spark, "io.tidemark.sql.FromJson")
    zone = spark.conf.get("spark.sql.session.timeZone")
    parsed = jvm_from_json.of(text._jc, _parse_datatype_string(schema).json(), json.dumps(options), zone)
    return JvmColumn(parsed)


def with_constants(frame: DataFrame, values: Sequence[object], schema: str) -> DataFrame:
    """``frame`` with ``values`` on every row, as the columns of ``schema``, joined in
    from a one-row frame (broadcast).

    What changes from one micro-batch to the next travels as data, not as literals:
    Spark writes long and timestamp literals into the Java it generates, so a literal
    that changes makes every batch compile its stages again; and the columns that read
    such values can be built once per pipeline
    (:func:`~spark_jobs.config.once_per_pipeline`) rather than through JVM calls on
    every batch."""
    return frame.crossJoin(F.broadcast(local_rows(frame.sparkSession, [values], schema)))


@dataclass(frozen=True)
class _Codec:
    """How a value of one Spark type travels in JSON: its type on the wire (None:
    its own), and the conversions on either side."""

    wire: DataType | None
    encode: Callable[[Any], Any]
    decode: Callable[[Column], Column]


def _micros(moment: datetime) -> int:
    # astimezone reads a naive datetime as local time.
    return (moment.astimezone(UTC) - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


_AS_IS = _Codec(None, lambda value: value, lambda column: column)
_CODECS: dict[type, _Codec] = {
    TimestampType: _Codec(LongType(), _micros, F.timestamp_micros),
    DateType: _Codec(IntegerType(), lambda day: (day - date(1970, 1, 1)).days, F.date_from_unix_date),
}
