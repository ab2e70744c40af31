"""The table registry (DESIGN §3): for a pipeline and a lakehouse root, the path,
SQL name and explicit Delta schema of every table, and an idempotent
create-if-missing.

Tables live at ``<root>/<layer>/<table>`` and are registered in the SQL catalog
as ``<layer>.<table>``. The ``ops`` tables are shared by every pipeline and
carry a ``pipeline`` column. Watermarks are stored as ``bigint`` epoch
milliseconds because a watermark can be -inf/+inf (Long.MIN/MAX), which no
timestamp can hold; use ``timestamp_millis(watermark)`` to read them as time.

Relative paths (the lakehouse root, a files source's landing folder) are
resolved once here, so nothing else joins paths.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame, DataFrameReader, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamReader
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DateType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs.config import PipelineConfig
from spark_jobs.jvm import java_class
from spark_jobs.transforms.aggregates import measure_types

CHANGE_FEED = ("delta.enableChangeDataFeed", "true")
# Every table's log checkpoint every 100 commits, not Delta's 10. The streams commit
# a few rows at a time, and a checkpoint rebuilds the table's state in Spark jobs:
# every 10 commits they cost more than the commits themselves, while a reader
# rebuilding the state from up to 99 JSON commits is no slower than from a checkpoint.
LOG_CHECKPOINT_INTERVAL = ("delta.checkpointInterval", "100")
CREATE_ATTEMPTS = 4
# Held while tables are created in a local lakehouse (see ``creation_lock``).
CREATION_LOCK = ".tidemark-create.lock"
CREATION_THREADS = 4
FIRST_COMMIT = "00000000000000000000.json"
LAYERS = ("bronze", "silver", "quarantine", "gold", "ops")

SPARK_TYPES: dict[str, DataType] = {
    "string": StringType(),
    "int": IntegerType(),
    "long": LongType(),
    "double": DoubleType(),
    "float": FloatType(),
    "boolean": BooleanType(),
    "timestamp": TimestampType(),
    "date": DateType(),
}


def lakehouse_root(root: str | None = None) -> str:
    """``root``, else ``$LAKEHOUSE_DIR``, else ``./lakehouse``; local paths made absolute."""
    chosen = root or os.environ.get("LAKEHOUSE_DIR") or "lakehouse"
    return chosen.rstrip("/") if "://" in chosen else os.path.abspath(chosen)


def join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts])


def hadoop_file(spark: SparkSession, path: str, *parts: str) -> tuple[Any, Any]:
    """(the Hadoop FileSystem, the Hadoop Path) of ``path`` joined with ``parts``:
    local folders and object stores alike, through the session's Hadoop settings."""
    hadoop_path = java_class(spark, "org.apache.hadoop.fs.Path")(join(path, *parts))
    return hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), hadoop_path


def read_text(spark: SparkSession, path: str, *parts: str) -> str:
    """A small file's text through Hadoop's FileSystem (``spark.read`` would be a job)."""
    filesystem, hadoop_path = hadoop_file(spark, path, *parts)
    stream = filesystem.open(hadoop_path)
    try:
        return java_class(spark, "org.apache.commons.io.IOUtils").toString(stream, "UTF-8")
    finally:
        stream.close()


@dataclass(frozen=True)
class TableRef:
    layer: str
    name: str
    path: str
    schema: StructType
    partition_by: tuple[str, ...] = ()
    properties: tuple[tuple[str, str], ...] = ()

    @property
    def sql_name(self) -> str:
        return f"{self.layer}.{self.name}"

    @property
    def table_properties(self) -> dict[str, str]:
        """The Delta properties the table is created with: its own over every table's."""
        return dict((LOG_CHECKPOINT_INTERVAL, *self.properties))


# One partition's clock in ``ops.watermark_history.partition_clocks``; times in epoch ms.
# Nullable throughout: Delta refuses NOT NULL inside an array.
PARTITION_CLOCKS_TYPE = ArrayType(
    StructType(
        [
            StructField("source_partition", StringType()),
            StructField("max_event_ms", LongType()),
            StructField("partition_watermark", LongType()),
            StructField("last_data_ms", LongType()),
            StructField("is_idle", BooleanType()),
            StructField("is_aligned", BooleanType()),
            # A custom generator's snapshot() as JSON (eventtime.generators).
            StructField("generator_state", StringType()),
        ]
    )
)


def _fields(*columns: tuple[str, DataType] | tuple[str, DataType, bool]) -> list[StructField]:
    return [StructField(column[0], column[1], column[2] if len(column) > 2 else True) for column in columns]


def measure_fields(config: PipelineConfig, with_state: bool) -> list[StructField]:
    """One column per configured measure. ``with_state`` adds the partial state
    that keeps each one mergeable (silver): avg carries its sum and count,
    approx_distinct its HLL sketch."""
    value_types = {column: SPARK_TYPES[config.schema[column]] for column in config.measures}
    return [StructField(name, kind) for name, kind in measure_types(config, value_types, with_state).items()]


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
    after = changes.where(F.col("_change_type").isin(*AFTER_CHANGE))
    before = changes.where(F.col("_change_type").isin(*BEFORE_CHANGE))
    return (
        after.drop("_change_type")
        .exceptAll(before.drop("_change_type"))
        .drop("_commit_version", "_commit_timestamp")
    )


def ops_tables(root: str | None = None) -> list[TableRef]:
    """The tables every pipeline shares."""
    root = lakehouse_root(root)
    ts, long, string = TimestampType(), LongType(), StringType()
    specs = {
        "rejects": _fields(
            ("pipeline", string, False),
            ("raw_record", string),
            ("reason", string, False),
            ("detail", string),
            ("source_partition", string),
            ("source_file", string),
            ("source_offset", long),
            ("ingest_time", ts),
            ("rejected_at", ts, False),
        ),
        "watermarks": _fields(
            ("pipeline", string, False),
            ("source_partition", string, False),
            ("max_event_time", ts),
            ("partition_watermark", long, False),
            ("is_idle", BooleanType(), False),
            ("is_aligned", BooleanType(), False),
            ("last_data_at", ts),
            ("batch_id", long),
            ("updated_at", ts, False),
            ("generator_state", string),
        ),
        "watermark_history": _fields(
            ("pipeline", string, False),
            ("batch_id", long, False),
            ("watermark", long, False),
            ("active_partitions", IntegerType(), False),
            ("idle_partitions", IntegerType(), False),
            ("on_time_count", long, False),
            ("late_count", long, False),
            ("processing_time", ts, False),
            # On a step's last row: the partition clocks after it (eventtime.clock_log).
            ("partition_clocks", PARTITION_CLOCKS_TYPE),
        ),
        "runs": _fields(
            ("run_id", string, False),
            ("job", string, False),
            ("pipeline", string, False),
            ("status", string, False),
            ("batches", long),
            ("rows_in", long),
            ("rows_out", long),
            ("late", long),
            ("rejected", long),
            ("started_at", ts, False),
            ("ended_at", ts),
            ("duration_ms", long),
            ("message", string),
        ),
    }
    partitioned = {name: ("pipeline",) for name in specs}
    return [
        TableRef("ops", name, join(root, "ops", name), StructType(fields), partitioned.get(name, ()))
        for name, fields in specs.items()
    ]


def tuning_table(root: str | None = None) -> TableRef:
    """``ops.tuning``: what ``tidemark tune --save`` found, a row per candidate and run
    (``engine.tuning_report.outcome_row``'s figures). Its first save creates it: the
    pipelines' tables come without it."""
    ts, long, string, double = TimestampType(), LongType(), StringType(), DoubleType()
    fields = _fields(
        ("pipeline", string, False),
        ("run_id", string, False),
        ("tuned_at", ts, False),
        ("history", string, False),
        ("candidate", string, False),
        ("pairs", long),
        ("late_pairs", long),
        ("late_share", double),
        ("late_pairs_by_partition", MapType(string, long)),
        ("windows", long),
        ("fired", long),
        ("refired", long),
        ("refire_share", double),
        ("fired_at_end_of_input", long),
        ("delay_event_p50_ms", double),
        ("delay_event_p95_ms", double),
        ("delay_batches_p50", double),
        ("delay_batches_p95", double),
    )
    root = lakehouse_root(root)
    return TableRef("ops", "tuning", join(root, "ops", "tuning"), StructType(fields), ("pipeline",))


class TableRegistry:
    """Every table of one pipeline (and the shared ops tables) under one root."""

    def __init__(self, config: PipelineConfig, root: str | None = None) -> None:
        self.config = config
        self.root = lakehouse_root(root)
        self._ops = {table.name: table for table in ops_tables(self.root)}

    def _ref(
        self,
        layer: str,
        name: str,
        fields: list[StructField],
        partition_by: tuple[str, ...] = (),
        properties: tuple[tuple[str, str], ...] = (),
    ) -> TableRef:
        return TableRef(
            layer, name, join(self.root, layer, name), StructType(fields), partition_by, properties
        )

    @property
    def landing_path(self) -> str | None:
        """A files source's landing folder; a relative path lives under the root."""
        path = self.config.source.path
        if path is None or "://" in path or os.path.isabs(path):
            return path
        return join(self.root, path)

    def payload_fields(self) -> list[StructField]:
        return [StructField(name, SPARK_TYPES[type_name]) for name, type_name in self.config.schema.items()]

    def key_fields(self, columns: tuple[str, ...]) -> list[StructField]:
        return [StructField(name, SPARK_TYPES[self.config.schema[name]]) for name in columns]

    def bronze_fields(self) -> list[StructField]:
        ts = TimestampType()
        return self.payload_fields() + _fields(
            ("event_id", StringType(), False),
            ("source_partition", StringType(), False),
            ("source_file", StringType()),
            ("source_offset", LongType(), False),
            ("event_time", ts, False),
            ("ingest_time", ts, False),
            ("processing_time", ts, False),
        )

    @property
    def bronze(self) -> TableRef:
        # Silver reads bronze's change feed: it tags each row with its bronze commit.
        # File statistics only on the columns queries prune by: collecting them for
        # every column (unique ids, long paths) costs bronze much of its write. Not
        # on the key or the source partition: a bronze file holds a micro-batch in
        # arrival order, every key and partition in it, so their bounds prune nothing,
        # and a string's bounds cost a copy of it a row.
        stats_columns = "event_time,ingest_time"
        properties = (CHANGE_FEED, ("delta.dataSkippingStatsColumns", stats_columns))
        return self._ref("bronze", self.config.name, self.bronze_fields(), properties=properties)

    @property
    def silver(self) -> TableRef:
        ts = TimestampType()
        fields = (
            _fields(("window_start", ts, False), ("window_end", ts, False))
            + self.key_fields(self.config.key)
            + _fields(("record_count", LongType(), False))
            + measure_fields(self.config, with_state=True)
            + _fields(
                ("revision", IntegerType(), False),
                ("status", StringType(), False),
                ("late_merged_count", LongType(), False),
                ("updated_at", ts, False),
            )
        )
        # Gold reads silver's change feed: the windows that fired, closed or got a revision.
        # Partitioned by status: a micro-batch reads and rewrites the open and fired
        # windows only, never the closed history (transforms.windows.in_play).
        return self._ref(
            "silver",
            f"{self.config.name}_windows",
            fields,
            partition_by=("status",),
            properties=(CHANGE_FEED,),
        )

    @property
    def quarantine(self) -> TableRef:
        ts, long = TimestampType(), LongType()
        fields = self.bronze_fields() + _fields(
            ("window_start", ts, False),
            ("window_end", ts, False),
            ("watermark", long, False),
            ("lateness_ms", long, False),
            ("reason", StringType(), False),
            ("status", StringType(), False),
            ("quarantined_at", ts, False),
            ("merged_at", ts),
            ("merge_run_id", StringType()),
        )
        return self._ref("quarantine", f"{self.config.name}_late", fields, ("status",))

    @property
    def gold(self) -> TableRef | None:
        gold = self.config.gold
        if gold is None:
            return None
        ts, long = TimestampType(), LongType()
        fields = (
            _fields(("grain_start", ts, False), ("grain_end", ts, False))
            + self.key_fields(gold.group_by)
            + _fields(
                ("record_count", long, False), ("window_count", long, False), ("key_count", long, False)
            )
            + measure_fields(self.config, with_state=False)
            + _fields(("updated_at", ts, False))
        )
        return self._ref("gold", f"{self.config.name}_{gold.name}", fields)

    @property
    def status_events(self) -> TableRef | None:
        offline = self.config.offline
        if offline is None:
            return None
        ts = TimestampType()
        fields = self.key_fields(offline.key) + _fields(
            ("status", StringType(), False),
            ("event_time", ts, False),
            ("watermark", LongType(), False),
            ("detected_at", ts, False),
        )
        return self._ref("gold", f"{self.config.name}_status_events", fields)

    @property
    def offline_state(self) -> TableRef | None:
        """Offline detection's state, one table so one MERGE moves it atomically:
        per key its ``last`` handled track and status, the ``buffered`` tracks the
        watermark has not passed yet, and one ``clock`` row (null key) with the
        watermark and last bronze version the detector has taken in."""
        offline = self.config.offline
        if offline is None:
            return None
        fields = self.key_fields(offline.key) + _fields(
            ("kind", StringType(), False),
            ("ts_ms", LongType(), False),
            ("status", StringType()),
            ("version", LongType()),
            ("updated_at", TimestampType(), False),
        )
        return self._ref("silver", f"{self.config.name}_offline_state", fields)

    @property
    def late_tracks(self) -> TableRef | None:
        """Offline detection's side output: tracks that arrived after the watermark
        had passed them, until the late merge re-derives their keys' statuses."""
        if self.config.offline is None:
            return None
        ts, long = TimestampType(), LongType()
        fields = self.bronze_fields() + _fields(
            ("watermark", long, False),
            ("lateness_ms", long, False),
            ("status", StringType(), False),
            ("quarantined_at", ts, False),
            ("merged_at", ts),
            ("merge_run_id", StringType()),
        )
        return self._ref("quarantine", f"{self.config.name}_late_tracks", fields, ("status",))

    @property
    def ops(self) -> dict[str, TableRef]:
        return dict(self._ops)

    def all(self) -> list[TableRef]:
        own = [
            self.bronze,
            self.silver,
            self.quarantine,
            self.gold,
            self.status_events,
            self.offline_state,
            self.late_tracks,
        ]
        return [table for table in own if table is not None] + list(self._ops.values())

    def create_missing(self, spark: SparkSession) -> list[TableRef]:
        """Create every table that does not exist yet; returns the ones created.
        When they all exist (every start but the first) this costs a few file
        lookups a table, and no Delta snapshot."""
        missing = [table for table in self.all() if not has_commits(spark, table.path)]
        if not missing:
            return []
        # Each creation is a Delta commit of about a second, mostly waiting: side by side.
        with (
            creation_lock(self.root),
            no_file_listing_in_checksums(spark),
            ThreadPoolExecutor(CREATION_THREADS) as pool,
        ):
            created = list(pool.map(lambda table: create_if_missing(spark, table), missing))
        return [table for table, made in zip(missing, created, strict=True) if made]


def has_commits(spark: SparkSession, path: str) -> bool:
    """Whether the table's log holds a commit or a checkpoint, without loading a
    snapshot. Only a log whose first commit was cleaned up and that has no
    ``_last_checkpoint`` is looked at the slow way, through an updated snapshot:
    Delta's ``isDeltaTable`` trusts a cached log, and one cached while another
    process was creating the table (its log folder made, its first commit not yet
    written) says "no table" until something updates it."""
    filesystem, log = hadoop_file(spark, path, "_delta_log")
    hadoop_path = java_class(spark, "org.apache.hadoop.fs.Path")
    if not filesystem.exists(log):
        return False
    if filesystem.exists(hadoop_path(log, FIRST_COMMIT)) or filesystem.exists(
        hadoop_path(log, "_last_checkpoint")
    ):
        return True
    return table_version(spark, path) >= 0


# Delta lists a small table's files in each version's checksum, derived from the
# previous version's list, so that readers need not rebuild the table's state. For a
# new table it first rebuilds the state of the empty table before it (a Spark job
# each, most of what creating a table costs). With the listing off, a commit that
# leaves a table without files still writes its empty list: the same checksum, and
# later commits derive theirs from it.
ALL_FILES_IN_CHECKSUM = "spark.databricks.delta.allFilesInCrc.enabled"


@contextmanager
def no_file_listing_in_checksums(spark: SparkSession) -> Iterator[None]:
    """The listing off, for creations only, on the session Delta's commits read their
    settings from (the JVM's active one, which need not be ``spark``)."""
    conf = java_class(spark, "org.apache.spark.sql.SparkSession").active().conf()
    before = conf.get(ALL_FILES_IN_CHECKSUM) if conf.contains(ALL_FILES_IN_CHECKSUM) else None
    conf.set(ALL_FILES_IN_CHECKSUM, "false")
    try:
        yield
    finally:
        if before is None:
            conf.unset(ALL_FILES_IN_CHECKSUM)
        else:
            conf.set(ALL_FILES_IN_CHECKSUM, before)


@contextmanager
def creation_lock(root: str) -> Iterator[None]:
    """Serialise table creation among the jobs of one machine's lakehouse.

    Delta commits to a local folder through a check-then-rename of the commit file
    and of its ``.crc`` beside it, with no lock between JVMs: two jobs creating the
    same table at the same instant can leave version 0 from one and its checksum
    from the other (``ChecksumException`` for every later reader). Object stores
    are left to Delta's LogStore for their scheme."""
    if "://" in root and not root.startswith("file:"):
        yield
        return
    folder = root.removeprefix("file://").removeprefix("file:")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, CREATION_LOCK), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def create_if_missing(spark: SparkSession, table: TableRef) -> bool:
    """Idempotent, and safe when two jobs race to create the same table. One commit
    through a transaction of our own (:meth:`~spark_jobs.delta_txn.Transaction.create`):
    the builder API costs a few Spark jobs per table."""
    from spark_jobs.delta_txn import Transaction  # it reads the log through this module

    # Two jobs started together race to create the same tables: the loser's commit
    # fails (version 0 exists). Retrying re-reads the log and, finding the table, does nothing.
    for attempt in range(CREATE_ATTEMPTS):
        try:
            txn = Transaction(spark, table.path)
            return txn.create(table.schema, table.partition_by, table.table_properties)
        except Exception:
            if attempt == CREATE_ATTEMPTS - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
            discard_unfinished_creation(spark, table.path)
    return False


DELTA_LOG = "org.apache.spark.sql.delta.DeltaLog"


def _delta_log(spark: SparkSession, path: str) -> Any:
    """The table's DeltaLog in the JVM, for what the log tells without a Spark job."""
    return java_class(spark, DELTA_LOG).forTable(spark._jsparkSession, path)


def _log_changes(
    spark: SparkSession, path: str, start: int, end: int, fail_on_data_loss: bool
) -> Iterator[Any]:
    """(version, actions) of each commit from ``start`` to ``end`` (inclusive); a
    missing commit file is skipped, or raises with ``fail_on_data_loss``."""
    nothing = java_class(spark, "scala.Option").empty()
    changes = _delta_log(spark, path).getChanges(start, end, nothing, fail_on_data_loss)
    while changes.hasNext():
        yield changes.next()


def table_version(spark: SparkSession, path: str) -> int:
    """The Delta table's latest version, from its log on the driver (reading the
    history instead is a Spark job per call)."""
    nothing = java_class(spark, "scala.Option").empty()
    return _delta_log(spark, path).update(False, nothing, nothing).version()


def never_written(spark: SparkSession, path: str) -> bool:
    """Whether the table holds nothing but its creation (Tidemark creates its tables
    empty, as version 0), told from the log without a Spark job."""
    return table_version(spark, path) == 0


def readable_from_first_commit(spark: SparkSession, path: str, most: int) -> bool:
    """Whether a stream can read the Delta table commit by commit from its first: it
    has at most ``most`` commits after its creation, its log still holds them all, and
    only appends came after the creation (no commit removed a file, so VACUUM cannot
    have deleted one a commit added, and none changed the schema or protocol). Read
    from the log on the driver, no Spark job."""
    latest = table_version(spark, path)
    if latest > most:
        return False
    try:
        for version_actions in _log_changes(spark, path, 0, latest, fail_on_data_loss=True):
            rewrites = _REWRITE_ACTIONS if version_actions._1() > 0 else _FILE_REMOVALS
            if any(kind in rewrites for kind, _ in _actions(version_actions._2())):
                return False
    except Py4JJavaError:  # a commit file is gone (the log was cleaned up)
        return False
    return True


@dataclass(frozen=True)
class Commit:
    version: int
    timestamp_ms: int
    user_metadata: str | None
    operation: str = ""

    def writer(self) -> str:
        """Who made the commit, as its label tells: a stream's job and batch
        (:func:`batch_metadata`), another writer's own label, or Delta's operation."""
        batch = batch_label(self.user_metadata)
        if batch is not None:
            return f"the {batch.job or 'stream'} stream's batch {batch.batch_id}"
        return self.user_metadata or self.operation or "an unlabelled commit"


def commits(spark: SparkSession, path: str, start: int, end: int) -> list[Commit]:
    """The commit infos of versions ``start`` to ``end`` of a Delta table, read from
    its log on the driver, no Spark job."""
    found = []
    for version_actions in _log_changes(spark, path, max(start, 0), end, fail_on_data_loss=False):
        info = next((action for kind, action in _actions(version_actions._2()) if kind == "CommitInfo"), None)
        if info is not None:
            metadata = info.userMetadata()
            found.append(
                Commit(
                    version_actions._1(),
                    info.timestamp().getTime(),
                    metadata.get() if metadata.isDefined() else None,
                    info.operation(),
                )
            )
    return found


# The actions that change a Delta table's rows, each carrying its partition values.
_FILE_ACTIONS = frozenset({"AddFile", "RemoveFile", "AddCDCFile"})
# The actions that change what every row means.
_TABLE_ACTIONS = frozenset({"Metadata", "Protocol"})
# The actions after which a table is no longer its appends read in order.
_FILE_REMOVALS = frozenset({"RemoveFile"})
_REWRITE_ACTIONS = _FILE_REMOVALS | _TABLE_ACTIONS


def changed_by_others(
    spark: SparkSession,
    path: str,
    after: int,
    until: int,
    partitions: tuple[str, frozenset[str]],
    own: frozenset[str],
) -> bool:
    """Whether a commit in versions ``after`` + 1 to ``until`` of a Delta table changed
    the rows of some partitions (``(column, values)``) or the table's metadata, without
    the transaction id or userMetadata label of one of the app ids in ``own``. Read from the log on the driver
    (no Spark job), so a writer that keeps what it last wrote in memory can tell
    whether it must read the table again. A log that no longer holds every one of
    those commits (cleaned up), or a table younger than ``after`` (made again),
    counts as changed."""
    if until == after:
        return False
    if until < after:
        return True
    column, values = partitions
    try:
        for version_actions in _log_changes(spark, path, after + 1, until, fail_on_data_loss=True):
            actions = version_actions._2()
            if _touches(actions, column, values) and not _written_by(actions, own):
                return True
    except Py4JJavaError:  # a commit file is gone: the log cannot vouch for the memory
        return True
    return False


# The userMetadata entry naming the stream batch a commit lands: [app id, batch id].
BATCH_LABEL = "tidemark_batch"
# A stream's commits are stamped by its writer's clock and its birth by the file
# system's; the log is read back this far past its birth.
CLOCK_SKEW_MS = 3_600_000
# Commits read from the log per request when looking back.
LOOKBACK_CHUNK = 16


# The userMetadata entry naming the job whose stream wrote a commit.
JOB_LABEL = "tidemark_job"


def batch_metadata(app_id: str, batch_id: int, entries: dict[str, object], job: str | None = None) -> str:
    """A commit's userMetadata: ``entries`` and the label of batch ``batch_id`` of
    ``app_id``, the stream of ``job``."""
    named = {JOB_LABEL: job} if job else {}
    return json.dumps({**entries, **named, BATCH_LABEL: [app_id, batch_id]}, separators=(",", ":"))


@dataclass(frozen=True)
class BatchLabel:
    """What :func:`batch_metadata` wrote into a commit's userMetadata."""

    app_id: str
    batch_id: int
    job: str | None


def batch_label(label: str | None) -> BatchLabel | None:
    """The stream batch a commit's userMetadata names (:func:`batch_metadata`), if any."""
    if not label or BATCH_LABEL not in label:
        return None
    try:
        entries = json.loads(label)
        app_id, batch_id = entries[BATCH_LABEL]
    except (ValueError, TypeError, KeyError):
        return None
    return BatchLabel(app_id, batch_id, entries.get(JOB_LABEL))


def batch_landed(spark: SparkSession, path: str, app_id: str, batch_id: int, born_ms: int) -> bool:
    """Whether batch ``batch_id`` of the stream ``app_id`` (born at ``born_ms``) has
    committed to the table, by a labelled commit (:func:`batch_metadata`) or a Delta
    transaction id. Read from the log on the driver (no Spark job), from its latest
    version back to the stream's newest commit there: a stream's batches commit in
    order, so that commit is the batch or an earlier one. A stream that never
    committed here is looked for back to commits older than itself."""
    latest = table_version(spark, path)
    for end in range(latest, -1, -LOOKBACK_CHUNK):
        start = max(0, end - LOOKBACK_CHUNK + 1)
        for version_actions in reversed(list(_log_changes(spark, path, start, end, fail_on_data_loss=False))):
            found, timestamp_ms = _stream_batch(version_actions._2(), app_id)
            if found is not None:
                return found >= batch_id
            if timestamp_ms is not None and timestamp_ms < born_ms - CLOCK_SKEW_MS:
                return False
    return False


def _stream_batch(actions: Any, app_id: str) -> tuple[int | None, int | None]:
    """(the batch of ``app_id`` a commit lands, or None; the commit's timestamp)."""
    found, timestamp_ms = None, None
    for kind, action in _actions(actions):
        if kind == "SetTransaction" and action.appId() == app_id:
            found = action.version()
        if kind == "CommitInfo":
            timestamp_ms = action.timestamp().getTime()
            label = action.userMetadata()
            batch = batch_label(label.get()) if label.isDefined() else None
            if batch is not None and batch.app_id == app_id:
                found = batch.batch_id
    return found, timestamp_ms


def _actions(actions: Any) -> Iterator[tuple[str, Any]]:
    for index in range(actions.size()):
        action = actions.apply(index)
        yield action.getClass().getSimpleName(), action


def _touches(actions: Any, column: str, values: frozenset[str]) -> bool:
    for kind, action in _actions(actions):
        if kind in _TABLE_ACTIONS:
            return True
        if kind in _FILE_ACTIONS:
            found = action.partitionValues().get(column)
            if not found.isDefined() or found.get() in values:
                return True
    return False


def _written_by(actions: Any, app_ids: frozenset[str]) -> bool:
    """Whether a commit carries the transaction id, or the userMetadata label, of one of ``app_ids``."""
    for kind, action in _actions(actions):
        if kind == "SetTransaction" and action.appId() in app_ids:
            return True
        if kind == "CommitInfo":
            label = action.userMetadata()
            if label.isDefined() and label.get() in app_ids:
                return True
    return False


def discard_unfinished_creation(spark: SparkSession, path: str) -> bool:
    """Remove the ``_delta_log`` a creation killed before its first commit left
    behind (Delta makes ``_delta_log/_staged_commits`` first): Delta then takes the
    path for a table and fails to load it (DELTA_TABLE_NOT_FOUND), forever. Only a
    log without a single commit or checkpoint file is removed. True if one was."""
    filesystem, log = hadoop_file(spark, path, "_delta_log")
    if not filesystem.exists(log):
        return False
    if any(status.getPath().getName()[:1].isdigit() for status in filesystem.listStatus(log)):
        return False
    return bool(filesystem.delete(log, True))
