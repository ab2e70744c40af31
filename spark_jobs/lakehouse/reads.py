"""Reads of a Delta table's change feed, the rows a commit really changed, and a
table's rows as a version left them."""

from __future__ import annotations

from pyspark.sql import DataFrame, DataFrameReader, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamReader


def change_feed(
    reader: DataFrameReader | DataStreamReader, path: str, first: int = 0, last: int | None = None
) -> DataFrame:
    """A Delta table's change feed from version ``first`` (through ``last``), read
    by ``reader`` (``spark.read`` or ``spark.readStream``)."""
    reader = reader.format("delta").option("readChangeFeed", "true").option("startingVersion", first)
    if last is not None:
        reader = reader.option("endingVersion", last)
    return reader.load(path)


AFTER_CHANGE = ("insert", "update_postimage")


BEFORE_CHANGE = ("delete", "update_preimage")


def changed_rows(changes: DataFrame) -> DataFrame:
    """A change feed's rows as each commit left them, less those it rewrote
    unchanged: an overwrite removes and re-adds every row of the files it replaces,
    so a row it did not change appears deleted and inserted alike in that commit."""
    return _one_side_only(changes, AFTER_CHANGE, BEFORE_CHANGE)


def replaced_rows(changes: DataFrame) -> DataFrame:
    """A change feed's rows as they were before a commit changed or removed them,
    less those it rewrote unchanged (:func:`changed_rows`' other side)."""
    return _one_side_only(changes, BEFORE_CHANGE, AFTER_CHANGE)


def _one_side_only(changes: DataFrame, side: tuple[str, ...], other: tuple[str, ...]) -> DataFrame:
    kept = changes.where(F.col("_change_type").isin(*side))
    dropped = changes.where(F.col("_change_type").isin(*other))
    return (
        kept.drop("_change_type")
        .exceptAll(dropped.drop("_change_type"))
        .drop("_commit_version", "_commit_timestamp")
    )


def rows_as_of(spark: SparkSession, path: str, version: int, predicate: str) -> DataFrame:
    """The table's rows where ``predicate`` holds, as version ``version`` left them."""
    return spark.read.format("delta").option("versionAsOf", version).load(path).where(predicate)
