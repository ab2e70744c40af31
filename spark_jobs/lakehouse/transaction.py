"""Delta transactions a writer drives itself (DESIGN §4b): it writes the files, names
the files they replace, and commits both at once, so Delta never rebuilds the
table's state to find what to replace.

A ``replaceWhere`` overwrite asks Delta which files match its predicate, and Delta
answers from the table's state, rebuilt from the log for every new version. A
writer that already knows the files it wrote last (it keeps them in memory between
its micro-batches) names them here instead, and the overwrite costs what an append
costs: one job writing the new files, and a commit. Only when it does not know them
(its first batch, or after another writer changed them) does it ask the state, once.

Conflicts stay Delta's, and each writer declares exactly what it read, so that
writers of disjoint parts of a table never fail each other: a partition writer
declares its partitions (a concurrent commit that adds or removes files there fails
it), a file rewrite only the files it replaces (:func:`rewrite_files`), and an
append nothing. The commit is a WRITE in the table's history, with its mode,
predicate and label, and Delta derives its checksum incrementally (a
``ManualUpdate`` would not). An append through it can carry in its label what only
writing the files told (an observation's figures), which the commit of a DataFrame
writer cannot.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq
from delta.exceptions import (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
    DeltaConcurrentModificationException,
    MetadataChangedException,
)
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructType,
    TimestampType,
)

from spark_jobs.jvm import java_class
from spark_jobs.lakehouse.files import hadoop_file
from spark_jobs.lakehouse.log import (
    DELTA_LOG,
    Commit,
    batch_label,
    clean_up_log_after,
    commits,
    partition_files_since,
    table_version,
)
from spark_jobs.sql import is_in_sql, quote_identifier

JavaObject = Any
SCALA_CONVERTERS = "scala.jdk.javaapi.CollectionConverters"
Result = TypeVar("Result")
# Delta's optimistic-concurrency failures: another writer committed first. Each
# is safe to retry from a fresh snapshot (a txn-guarded write that the other
# writer already made is then skipped).
CONFLICTS = (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
    DeltaConcurrentModificationException,
    MetadataChangedException,
)
# A write that still conflicts after this many attempts, or this long, gives up:
# retrying against a writer that commits faster than an attempt takes never ends.
CONFLICT_ATTEMPTS = 8
CONFLICT_WITHIN_S = 180.0


class MissingColumns(ValueError):
    """Rows with a column the table lacks: write them with the schema merged instead."""


@functools.lru_cache(maxsize=256)
def _typed_as(schema: str) -> tuple[Column, ...]:
    """The columns that give a frame the table schema ``schema`` (JSON), each cast to
    its type: built once per schema, as each cast costs JVM calls on every write."""
    return tuple(
        F.col(quote_identifier(field.name)).cast(field.dataType).alias(field.name)
        for field in StructType.fromJson(json.loads(schema))
    )


class Transaction:
    """One optimistic transaction on the Delta table at ``path``, reading its latest version."""

    def __init__(self, spark: SparkSession, path: str) -> None:
        self.spark = spark
        self.path = path
        self._log = java_class(spark, DELTA_LOG).forTable(spark._jsparkSession, path)
        self._txn = self._log.startTransaction()

    @property
    def read_version(self) -> int:
        return self._txn.readVersion()

    @property
    def table_id(self) -> str:
        """The table's id (Delta's metadata id): a table made again at a path has a new one."""
        return self._txn.metadata().id()

    @property
    def schema(self) -> StructType:
        """The table's schema at the version read (from the log, no Spark job)."""
        return StructType.fromJson(json.loads(self._txn.metadata().schema().json()))

    def listed_files(self) -> list[JavaObject] | None:
        """The table's data files (``AddFile``) at the version read, as its checksum lists
        them (Delta lists a small table's files there, and Tidemark creates its tables with
        the list empty); None when it does not."""
        checksum = self._txn.snapshot().checksumOpt()
        if not checksum.isDefined():
            return None
        if checksum.get().numFiles() == 0:
            return []
        listed = checksum.get().allFiles()
        return self._python_list(listed.get()) if listed.isDefined() else None

    def all_files(self) -> list[JavaObject]:
        """The table's data files at the version read: from the checksum's list
        (:meth:`listed_files`), or else from the table's state, which Delta rebuilds
        from the log for every new version (a Spark job). Declares no read."""
        listed = self.listed_files()
        if listed is not None:
            return listed
        return self._python_list(self._txn.snapshot().filesForScan(self._scala_seq([]), True).files())

    def partition_files(self, column: str, values: frozenset[str]) -> list[JavaObject]:
        """The data files of the partitions ``column`` in ``values``: from the checksum's
        list (:meth:`listed_files`), or else from the table's state, which Delta rebuilds
        from the log for every new version (a Spark job). The caller declares what it read
        (:meth:`read_partitions`, :meth:`read_files`)."""
        listed = self.listed_files()
        if listed is not None:
            return [file for file in listed if partition_value(file, column) in values]
        condition = is_in_sql(column, sorted(values))
        expression = self.spark._jsparkSession.sessionState().sqlParser().parseExpression(condition)
        return self._python_list(self._txn.filterFiles(self._scala_seq([expression]), False))

    def files_where(self, condition: str) -> list[JavaObject]:
        """The data files at the version read that may hold rows where ``condition`` (SQL)
        holds, pruned by their partition values and statistics (a Spark job the first
        time a version's state is needed). Declares no read (:meth:`read_files`)."""
        analyzed = self.frame([]).where(condition)._jdf.queryExecution().analyzed()
        # Literals folded (a cast of one defeats the statistics), and conjuncts apart: Delta
        # prunes by partitions and statistics only with each in its own filter.
        folded = getattr(self._class("org.apache.spark.sql.catalyst.optimizer.ConstantFolding$"), "MODULE$")
        filters = _conjuncts(folded.apply(analyzed).condition())
        # Their record counts kept: a rewrite tells how many rows it removed.
        scan = self._txn.snapshot().filesForScan(self._scala_seq(filters), True)
        return self._python_list(scan.files())

    def read_files(self, files: Sequence[JavaObject]) -> None:
        """Declare ``files`` read: a concurrent commit that removes one of them fails this
        one with a Delta conflict. Appends beside them do not: a transaction that declares
        only the files it rewrites shares nothing else with other writers."""
        self._txn.trackFilesRead(self._scala_seq(files))

    def read_partitions(self, column: str, values: frozenset[str]) -> None:
        """Declare the partitions ``column`` in ``values`` read: a concurrent commit that
        adds a file there fails this one; commits to other partitions do not (Delta's
        default isolation, Serializable, checks blind appends too)."""
        expression = (
            self.spark._jsparkSession.sessionState()
            .sqlParser()
            .parseExpression(is_in_sql(column, sorted(values)))
        )
        # Partition-only, checked against each concurrent file's partition values.
        self._txn.trackReadPredicates(self._scala_seq([expression]), True, True)

    def frame(self, files: Sequence[JavaObject]) -> DataFrame:
        """The rows of ``files`` (partition columns included), as a DataFrame."""
        jdf = self._log.createDataFrame(
            self._txn.snapshot(), self._scala_seq(files), False, self._class("scala.Option").empty()
        )
        return DataFrame(jdf, self.spark)

    def write(self, frame: DataFrame) -> list[JavaObject]:
        """Write ``frame`` as new files of the table (partitioned and with statistics as
        the table says; nothing committed yet). Returns their ``AddFile`` actions."""
        # Typed as the table: an append through Delta's writer checks the schema, writeFiles does not.
        schema = self._txn.metadata().schema().json()
        _require_fields(StructType.fromJson(json.loads(schema)), frame.schema)
        typed = frame.select(*_typed_as(schema))
        return [
            action
            for action in self._python_list(self._txn.writeFiles(typed._jdf))
            if action.getClass().getSimpleName() == "AddFile"
        ]

    def write_rows(self, rows: Sequence[Sequence[object]], schema: StructType) -> list[JavaObject]:
        """Write a few driver-side ``rows`` (values in ``schema``'s order) as new files of
        the table, one per partition, from the driver: no Spark job (a Delta append of a
        run-log row or a watermark step costs one). Returns their ``AddFile`` actions;
        nothing committed yet. The table's columns the rows lack are null."""
        table = self.schema
        _require_fields(table, schema)
        partitions = list(self._python_list(self._txn.metadata().partitionColumns()))
        named = [_named(row, schema) for row in rows]
        groups: dict[tuple[str | None, ...], list[dict[str, object]]] = {}
        for row in named:
            groups.setdefault(tuple(_partition_text(row.get(column)) for column in partitions), []).append(
                row
            )
        data = StructType([field for field in table.fields if field.name not in partitions])
        return [
            self._add_file(dict(zip(partitions, values, strict=True)), members, data)
            for values, members in groups.items()
        ]

    def _add_file(
        self, partition_values: dict[str, str | None], rows: list[dict[str, object]], data: StructType
    ) -> JavaObject:
        columns = {
            field.name: [_arrow_value(row.get(field.name), field.dataType) for row in rows] for field in data
        }
        arrow = pa.table(
            {name: pa.array(values, _arrow_type(data[name].dataType)) for name, values in columns.items()}
        )
        sink = pa.BufferOutputStream()
        pq.write_table(arrow, sink, compression="snappy")
        content = sink.getvalue().to_pybytes()
        folder = "".join(f"{column}={value}/" for column, value in partition_values.items())
        relative = f"{folder}part-00000-{uuid.uuid4()}.c000.snappy.parquet"
        filesystem, path = hadoop_file(self.spark, self._log.dataPath().toString(), relative)
        stream = filesystem.create(path, False)
        try:
            stream.write(bytearray(content))
        finally:
            stream.close()
        add = {
            "path": relative,
            "partitionValues": partition_values,
            "size": len(content),
            "modificationTime": filesystem.getFileStatus(path).getModificationTime(),
            "dataChange": True,
            "stats": json.dumps(_statistics(columns, data), separators=(",", ":")),
        }
        return self._action({"add": add})

    def read_whole_table(self) -> None:
        """Declare the whole table read: any concurrent commit that changes data then
        fails this one with a Delta conflict (a blind append never does)."""
        self._txn.readWholeTable()

    def commit_overwrite(
        self,
        added: Iterable[JavaObject],
        replaced: Iterable[JavaObject],
        predicate: str,
        label: str,
        txn: tuple[str, int] | None = None,
    ) -> int:
        """Commit ``added`` files in place of ``replaced`` ones as a WRITE (overwrite
        where ``predicate``) labelled ``label`` (its userMetadata); returns the version.
        ``txn`` as for :meth:`commit_append`."""
        removed = [file.remove() for file in replaced]
        return self._commit_write("Overwrite", self._with_txn([*added, *removed], txn), predicate, label)

    def commit_append(
        self, added: Iterable[JavaObject], label: str, txn: tuple[str, int] | None = None
    ) -> int:
        """Commit ``added`` files as a WRITE (append) labelled ``label``; returns the
        version. ``txn`` (app id, version) is recorded as Delta's txnAppId/txnVersion
        record it (see :meth:`has_committed`)."""
        return self._commit_write("Append", self._with_txn(list(added), txn), None, label)

    def _with_txn(self, actions: list[JavaObject], txn: tuple[str, int] | None) -> list[JavaObject]:
        if txn is None:
            return actions
        recorded = {"appId": txn[0], "version": txn[1], "lastUpdated": int(time.time() * 1000)}
        return [*actions, self._action({"txn": recorded})]

    def has_committed(self, app_id: str, version: int) -> bool:
        """Whether the transaction id (``app_id``, ``version``) committed already: from
        the version's checksum, where Delta lists a table's transaction ids (up to a
        hundred of them, and none that expire), or else from the table's state, which
        Delta's own lookup always rebuilds from the log (a Spark job, for the flush and
        every idleness check)."""
        checksum = self._txn.snapshot().checksumOpt()
        listed = checksum.get().setTransactions() if checksum.isDefined() else None
        if listed is None or not listed.isDefined():
            return self._txn.txnVersion(app_id) >= version
        # What Delta's lookup records besides: a concurrent commit of app_id then conflicts with this one.
        self._txn.readTxn().addOne(app_id)
        return any(
            txn.appId() == app_id and txn.version() >= version for txn in self._python_list(listed.get())
        )

    def _action(self, action: dict[str, object]) -> JavaObject:
        return self._class("org.apache.spark.sql.delta.actions.Action").fromJson(json.dumps(action))

    def _commit_write(self, mode: str, actions: list[JavaObject], predicate: str | None, label: str) -> int:
        option = self._class("scala.Option")
        write = self._class("org.apache.spark.sql.delta.DeltaOperations$Write")(
            getattr(self._class("org.apache.spark.sql.SaveMode"), mode),
            option.empty(),
            option.empty() if predicate is None else option.apply(predicate),
            option.apply(label),
            *(option.empty() for _ in range(5)),
        )
        version = self._txn.commit(self._scala_seq(actions), write)
        clean_up_log_after(self.spark, self._log, version)
        return version

    def create(self, schema: StructType, partition_by: Sequence[str], properties: dict[str, str]) -> bool:
        """Commit the table's first version (as CREATE TABLE does, through the same
        transaction: Delta picks the protocol its properties need). False, and nothing
        written, if the table exists."""
        if self.read_version >= 0:
            return False
        metadata = self._action(
            {
                "metaData": {
                    "id": str(uuid.uuid4()),
                    "format": {"provider": "parquet", "options": {}},
                    "schemaString": schema.json(),
                    "partitionColumns": list(partition_by),
                    "configuration": properties,
                    "createdTime": int(time.time() * 1000),
                }
            }
        )
        self._txn.updateMetadataForNewTable(metadata)
        create = self._class("org.apache.spark.sql.delta.DeltaOperations$CreateTable")(
            metadata, False, False, self._class("scala.Option").empty()
        )
        self._txn.commit(self._scala_seq([]), create)
        return True

    def _class(self, name: str) -> JavaObject:
        return java_class(self.spark, name)

    def _scala_seq(self, items: Iterable[JavaObject]) -> JavaObject:
        java_list = self._class("java.util.ArrayList")()
        for item in items:
            java_list.add(item)
        return self._class(SCALA_CONVERTERS).asScala(java_list).toSeq()

    def _python_list(self, seq: JavaObject) -> list[JavaObject]:
        # By index: py4j ends an iteration on the JVM's NoSuchElementException, whose
        # conversion into a Python error is slow (PySpark's and Delta's handlers test it
        # against every exception class they know).
        items = self._class(SCALA_CONVERTERS).asJava(seq)
        return [items.get(index) for index in range(items.size())]


def _conjuncts(expression: JavaObject) -> list[JavaObject]:
    """The terms of a conjunction (``a AND (b AND c)``: a, b, c)."""
    if expression.getClass().getSimpleName() != "And":
        return [expression]
    return [*_conjuncts(expression.left()), *_conjuncts(expression.right())]


def partition_value(file: JavaObject, column: str) -> str | None:
    """The value of partition ``column`` in a data file's action (None if it has none)."""
    found = file.partitionValues().get(column)
    return found.get() if found.isDefined() else None


@dataclass(frozen=True)
class KnownFiles:
    """The data files of a writer's partitions as its own commit at ``version`` left them."""

    version: int
    files: list[JavaObject]


class PartitionWriter:
    """A process's writer of some partitions of a Delta table that it overwrites again
    and again (silver's windows in play, a pipeline's clock snapshot). It keeps the
    files of those partitions as its last commit left them, follows what other writers
    committed there since through the log, without a Spark job (an idleness step, a
    merge, OPTIMIZE), and asks the table's state for them only when it knows none or
    the log cannot tell (:func:`~spark_jobs.lakehouse.log.partition_files_since`)."""

    def __init__(self, path: str, column: str, values: frozenset[str]) -> None:
        self.path = path
        self.column = column
        self.values = values
        self.kept: KnownFiles | None = None

    @property
    def predicate(self) -> str:
        return is_in_sql(self.column, sorted(self.values))

    def overwrite(self, spark: SparkSession, rows_from: Callable[[DataFrame], DataFrame], label: str) -> int:
        """Replace the partitions' rows with ``rows_from(their current rows)``, in one
        commit labelled ``label``; returns its version. Rows that ``rows_from`` moves
        to other partitions land there, beside the replaced ones. Delta's concurrency
        exceptions pass (the caller retries: a retry looks at the table afresh)."""
        return self._replace(spark, lambda txn, files: txn.write(rows_from(txn.frame(files))), label)

    def replace_rows(
        self, spark: SparkSession, rows: Sequence[Sequence[object]], schema: StructType, label: str
    ) -> int:
        """Replace the partitions' rows with a few driver-side ``rows``
        (:meth:`Transaction.write_rows`), in one commit labelled ``label``."""
        return self._replace(spark, lambda txn, _: txn.write_rows(rows, schema), label)

    def _replace(
        self,
        spark: SparkSession,
        new_files: Callable[[Transaction, list[JavaObject]], list[JavaObject]],
        label: str,
    ) -> int:
        txn = Transaction(spark, self.path)
        txn.read_partitions(self.column, self.values)
        kept, self.kept = self.kept, None
        files = None
        if kept is not None:
            files = partition_files_since(
                spark, self.path, kept.files, kept.version, txn.read_version, (self.column, self.values)
            )
        if files is None:
            files = txn.partition_files(self.column, self.values)
        txn.read_files(files)
        added = new_files(txn, files)
        version = txn.commit_overwrite(added, files, self.predicate, label)
        mine = [file for file in added if partition_value(file, self.column) in self.values]
        self.kept = KnownFiles(version, mine)
        return version


_PARTITION_WRITERS: dict[tuple[str, str, frozenset[str]], PartitionWriter] = {}


def partition_writer(path: str, column: str, values: frozenset[str]) -> PartitionWriter:
    """This process's writer of the partitions ``column`` in ``values`` of the table at ``path``."""
    return _PARTITION_WRITERS.setdefault((path, column, values), PartitionWriter(path, column, values))


def forget_partition_writers() -> None:
    """Forget every file this process knows, as a new process starts."""
    _PARTITION_WRITERS.clear()


def _partition_text(value: object) -> str | None:
    """A partition value as Delta records it; only plain names, which need no escaping
    in a path (Tidemark partitions by pipeline name, status and layer)."""
    if value is None:
        return None
    text = str(value)
    if not PLAIN_NAME.fullmatch(text):
        raise ValueError(f"partition value {text!r} is not a plain name")
    return text


PLAIN_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def _arrow_type(kind: DataType) -> pa.DataType:
    """The Arrow type Spark reads back as ``kind`` (timestamps as UTC microseconds)."""
    simple = {
        StringType: pa.string(),
        LongType: pa.int64(),
        IntegerType: pa.int32(),
        DoubleType: pa.float64(),
        BooleanType: pa.bool_(),
        TimestampType: pa.timestamp("us", tz="UTC"),
    }
    if type(kind) in simple:
        return simple[type(kind)]
    if isinstance(kind, ArrayType):
        return pa.list_(_arrow_type(kind.elementType))
    if isinstance(kind, StructType):
        return pa.struct([pa.field(field.name, _arrow_type(field.dataType)) for field in kind.fields])
    if isinstance(kind, MapType):
        return pa.map_(_arrow_type(kind.keyType), _arrow_type(kind.valueType))
    raise TypeError(f"no driver-side writing of {kind.simpleString()}")


def _require_fields(table: DataType, rows: DataType, path: str = "") -> None:
    """Raise :class:`MissingColumns` if ``rows`` has a field, at any depth, that ``table`` lacks."""
    if isinstance(table, StructType) and isinstance(rows, StructType):
        for field in rows.fields:
            if field.name not in table.fieldNames():
                raise MissingColumns(
                    f"the table has no column {path}{field.name}: write with its schema merged"
                )
            _require_fields(table[field.name].dataType, field.dataType, f"{path}{field.name}.")
    elif isinstance(table, ArrayType) and isinstance(rows, ArrayType):
        _require_fields(table.elementType, rows.elementType, path)


def _named(value: object, kind: DataType) -> object:
    """A driver-side value with every struct, at any depth, as a dict by ``kind``'s
    field names (a struct may come as a tuple in ``kind``'s field order)."""
    if value is None:
        return None
    if isinstance(kind, ArrayType):
        return [_named(item, kind.elementType) for item in value]
    if isinstance(kind, StructType):
        items = value.items() if isinstance(value, dict) else zip(kind.fieldNames(), value, strict=True)
        return {name: _named(item, kind[name].dataType) for name, item in items}
    return value


def _arrow_value(value: object, kind: DataType) -> object:
    """A named value (see :func:`_named`) as Arrow takes it for the table's ``kind``: a
    naive datetime is local time, as in ``sql.local_rows`` and ``createDataFrame``; a
    struct field the value lacks is null."""
    if value is None:
        return None
    if isinstance(kind, TimestampType):
        return value.astimezone(UTC)
    if isinstance(kind, ArrayType):
        return [_arrow_value(item, kind.elementType) for item in value]
    if isinstance(kind, StructType):
        return {name: _arrow_value(value.get(name), kind[name].dataType) for name in kind.fieldNames()}
    return value


def _statistics(columns: dict[str, list[object]], data: StructType) -> dict[str, object]:
    """Delta's file statistics, for the columns readers skip files by: record and null
    counts of every flat column, bounds of the integer ones (a bound left out only
    means no file is skipped by it)."""
    flat = [field for field in data if not isinstance(field.dataType, ArrayType | StructType | MapType)]
    bounded = [field.name for field in flat if isinstance(field.dataType, LongType | IntegerType)]
    present = {name: [value for value in columns[name] if value is not None] for name in bounded}
    return {
        "numRecords": len(next(iter(columns.values()), [])),
        "minValues": {name: min(values) for name, values in present.items() if values},
        "maxValues": {name: max(values) for name, values in present.items() if values},
        "nullCount": {field.name: sum(value is None for value in columns[field.name]) for field in flat},
    }


@dataclass(frozen=True)
class Rewrite:
    """A committed :func:`rewrite_files`: its version, and the rows it replaced and wrote."""

    version: int
    rows_replaced: int
    rows_written: int


def record_count(file: JavaObject) -> int:
    """The rows of a data file, from its statistics."""
    return json.loads(file.stats())["numRecords"]


def rewrite_files(
    spark: SparkSession,
    path: str,
    condition: str,
    rows_from: Callable[[DataFrame], DataFrame],
    label: str,
    txn: tuple[str, int] | None = None,
) -> Rewrite | None:
    """Replace the rows of the files that may hold rows where ``condition`` holds with
    ``rows_from(their rows)``, in one commit labelled ``label``; returns what it
    committed, or None when nothing was: the transaction id ``txn`` had committed
    already, or no file matched and no row was added. Only those files
    count as read, so writers that append beside them, or rewrite other files, never
    conflict with it: a concurrent commit fails it only by removing one of its files
    or, under the same ``txn`` app id, by committing that id. Delta's concurrency
    exceptions pass (the caller retries from a fresh look)."""
    transaction = Transaction(spark, path)
    if txn is not None and transaction.has_committed(*txn):
        return None
    files = transaction.files_where(condition)
    transaction.read_files(files)
    added = transaction.write(rows_from(transaction.frame(files)))
    if not files and not added:
        return None
    version = transaction.commit_overwrite(added, files, condition, label, txn)
    return Rewrite(version, sum(map(record_count, files)), sum(map(record_count, added)))


class ConflictsExhausted(RuntimeError):
    """A write that kept losing to concurrent writers; the message names them."""


def retry_on_conflict(
    action: Callable[[], Result],
    what: str,
    table: tuple[SparkSession, str] | None = None,
    attempts: int = CONFLICT_ATTEMPTS,
    within_s: float = CONFLICT_WITHIN_S,
    pause_s: float = 0.5,
    owner: str | None = None,
) -> Result | None:
    """Run ``action`` (which must build its DataFrames itself, so a retry reads the
    table anew) until it commits without a Delta conflict; other errors pass. At most
    ``attempts`` attempts, none started after ``within_s`` seconds: then
    :class:`ConflictsExhausted`, naming the commits it lost to when ``table``
    (session, path) is given. A loss to a commit of the stream job ``owner`` (its
    label, :func:`~spark_jobs.tables.batch_metadata`) ends the retries at once and
    returns None: that stream owns the work and takes it over."""
    started = time.monotonic()
    lost_to: list[Commit] = []
    for attempt in range(1, attempts + 1):
        before = table_version(*table) if table else None
        try:
            return action()
        except CONFLICTS as conflict:
            winners = _commits_after(table, before)
            lost_to += winners
            if owner is not None and any(_is_of_job(commit, owner) for commit in winners):
                print(f"tidemark: {what} handed over to the {owner} stream beside it", file=sys.stderr)
                return None
            elapsed = time.monotonic() - started
            if attempt == attempts or elapsed >= within_s:
                raise ConflictsExhausted(
                    f"{what} conflicted with concurrent writers {attempt} times in {elapsed:.0f} s "
                    f"and gave up; it lost to {_writers(lost_to) or type(conflict).__name__}"
                ) from conflict
            print(
                f"tidemark: {what} conflicted with {_writers(winners) or 'a concurrent writer'} "
                f"({type(conflict).__name__}); attempt {attempt + 1} of {attempts}",
                file=sys.stderr,
            )
            time.sleep(pause_s * attempt)
    raise AssertionError("unreachable")


def _commits_after(table: tuple[SparkSession, str] | None, version: int | None) -> list[Commit]:
    if table is None or version is None:
        return []
    return commits(*table, version + 1, table_version(*table))


def _is_of_job(commit: Commit, job: str) -> bool:
    found = batch_label(commit.user_metadata)
    return found is not None and found.job == job


def _writers(lost_to: Sequence[Commit]) -> str:
    """The latest commits of ``lost_to`` and their writers, for a message."""
    return ", ".join(f"version {commit.version} ({commit.writer()})" for commit in lost_to[-6:])
