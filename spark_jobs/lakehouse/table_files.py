"""A process's view of a Delta table's data files, followed through the log.

Delta finds a version's files by rebuilding the version's state from the log (a
Spark job reading the last checkpoint and the commits after it), and it does so for
every new version it is asked about. Its checksum lists the files, which spares that
job, only while a table has at most 50 of them. A table a stream commits to every
second passes that in a minute, and its state then grows with every file it ever
removed (for as long as Delta keeps its tombstones), so a step that asks for
the files on every batch pays more on every batch. A process instead keeps each
table's files and brings them to a new version by reading only the commits in
between (:func:`~spark_jobs.lakehouse.log.follow_files`); it rebuilds the state only
the first time, or where the log cannot tell.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.lakehouse.log import follow_files
from spark_jobs.lakehouse.transaction import Transaction
from spark_jobs.sql import quote_identifier, string_literal

JavaObject = Any


@dataclass(frozen=True)
class Within:
    """The rows where ``low <= column < high`` (a timestamp column; time-zone aware limits)."""

    column: str
    low: datetime
    high: datetime

    def sql(self) -> str:
        return (
            f"{quote_identifier(self.column)} >= TIMESTAMP {string_literal(self.low.isoformat())}"
            f" AND {quote_identifier(self.column)} < TIMESTAMP {string_literal(self.high.isoformat())}"
        )

    def condition(self) -> Column:
        return F.expr(self.sql())


@dataclass(frozen=True)
class DataFile:
    """A data file's ``AddFile``, and the bounds its statistics give its columns."""

    action: JavaObject
    lowest: dict[str, Any] = field(default_factory=dict)
    highest: dict[str, Any] = field(default_factory=dict)
    # A column's bounds as times, parsed once: every batch asks each of a table's files.
    _times: dict[str, tuple[datetime | None, datetime | None]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @classmethod
    def of(cls, action: JavaObject) -> DataFile:
        stats = action.stats()
        parsed = json.loads(stats) if stats else {}
        return cls(action, parsed.get("minValues") or {}, parsed.get("maxValues") or {})

    def may_hold(self, within: Within) -> bool:
        """Whether the file may hold rows ``within``: only bounds its statistics give
        rule it out (Delta truncates timestamp bounds to the millisecond, downwards,
        which can only widen the range they rule in for millisecond-aligned limits)."""
        lowest, highest = self._bounds_as_times(within.column)
        if highest is not None and highest < within.low:
            return False
        return lowest is None or lowest < within.high

    def _bounds_as_times(self, column: str) -> tuple[datetime | None, datetime | None]:
        if column not in self._times:
            lowest, highest = self.lowest.get(column), self.highest.get(column)
            self._times[column] = (
                None if lowest is None else datetime.fromisoformat(lowest),
                None if highest is None else datetime.fromisoformat(highest),
            )
        return self._times[column]


@dataclass
class TableFiles:
    """The data files of the Delta table at ``path`` at ``version``, as this process
    last saw them; ``table_id`` tells a table made again at the same path."""

    path: str
    version: int | None = None
    table_id: str | None = None
    files: dict[str, DataFile] = field(default_factory=dict)

    def at(self, txn: Transaction) -> list[DataFile]:
        """The table's data files at the version ``txn`` read."""
        until, table_id = txn.read_version, txn.table_id
        followed = (
            self.version is not None
            and self.table_id == table_id
            and follow_files(txn.spark, self.path, self.files, self.version, until, keep=DataFile.of)
        )
        if not followed:
            self.files = {action.path(): DataFile.of(action) for action in txn.all_files()}
        self.version, self.table_id = until, table_id
        return list(self.files.values())


_VIEWS: dict[str, TableFiles] = {}


def table_files(path: str) -> TableFiles:
    """This process's view of the files of the table at ``path``."""
    return _VIEWS.setdefault(path, TableFiles(path))


def forget_table_files() -> None:
    """Forget every table's files, as a new process starts."""
    _VIEWS.clear()


def files_within(txn: Transaction, within: Within | None) -> list[JavaObject]:
    """The ``AddFile`` of each data file at the version ``txn`` read that may hold
    rows ``within`` (None: every file), from this process's view of the table."""
    files = table_files(txn.path).at(txn)
    return [file.action for file in files if within is None or file.may_hold(within)]


def read_latest(spark: SparkSession, path: str, within: Within | None = None) -> tuple[DataFrame, int]:
    """The table's rows at its latest version (only of the files that may hold rows
    ``within``: the caller still filters the rows), and that version."""
    txn = Transaction(spark, path)
    return txn.frame(files_within(txn, within)).select(*txn.schema.fieldNames()), txn.read_version


def rewrite_within(
    spark: SparkSession,
    path: str,
    within: Within | None,
    rows_from: Callable[[DataFrame], DataFrame],
    label: str,
    txn: tuple[str, int] | None = None,
) -> bool:
    """Replace the rows of the table's files that may hold rows ``within`` (None: every file) with
    ``rows_from(their rows)``, in one commit labelled ``label``; False, and nothing
    written, when the transaction id ``txn`` had committed already. The whole table
    counts as read, as a MERGE's target does: any concurrent commit of data fails it
    with a Delta conflict, so two rewrites that each add the same new row never both
    land. Delta's concurrency exceptions pass (the caller retries from a fresh look)."""
    transaction = Transaction(spark, path)
    if txn is not None and transaction.has_committed(*txn):
        return False
    transaction.read_whole_table()
    files = files_within(transaction, within)
    added = transaction.write(rows_from(transaction.frame(files)))
    transaction.commit_overwrite(added, files, within.sql() if within else "true", label, txn)
    return True
