"""The pipeline clock on the Spark side: planned on the driver through the shared
:class:`WatermarkTracker`, persisted as ``ops.watermark_history`` (a row per
watermark step, the step's last carrying the partition clocks after it: one commit)
with ``ops.watermarks`` as a snapshot of the clocks (a row per source partition),
read back on start by :mod:`spark_jobs.eventtime.clock_log`'s rule, and kept in memory
between a stream's batches (DESIGN §4b)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_jobs.engine.judging import Summary
from spark_jobs.eventtime.clock import MIN_WATERMARK
from spark_jobs.eventtime.clock_log import ClockState, clock_entry, clock_state, snapshot_version
from spark_jobs.eventtime.tracker import PartitionInput, WatermarkTracker
from spark_jobs.lakehouse.log import changed_by_others, commits, never_written, table_version
from spark_jobs.lakehouse.reads import change_feed
from spark_jobs.lakehouse.transaction import MissingColumns, Transaction, partition_writer, retry_on_conflict
from spark_jobs.lakehouse.writes import delta_txn
from spark_jobs.sources.progress import (
    SourceProgress,
    known_partitions,
    lagging_partitions,
    partition_order,
    written_partitions,
)
from spark_jobs.sql import local_rows, string_literal
from spark_jobs.tables import PARTITION_CLOCKS_TYPE, TableRegistry


@dataclass(frozen=True)
class VersionClock:
    """The pipeline clock around one bronze version (one event-time micro-batch)."""

    version: int
    processing_ms: int
    watermark_before: int
    watermark_after: int
    active_partitions: int
    idle_partitions: int


@dataclass(frozen=True)
class SavedClock:
    """The pipeline clock as the last recorded step left it, and the last bronze
    version silver judged (None before silver's first batch). ``snapshot_stale``:
    ``ops.watermarks`` does not hold it yet; ``last_step_batch``: the largest batch id
    of the steps read back (the end of input is recorded one beyond the judged version);
    ``recorded_ms``: the processing time of the step the clocks come from."""

    tracker: WatermarkTracker
    judged_version: int | None
    snapshot_stale: bool = False
    last_step_batch: int | None = None
    recorded_ms: int | None = None


def read_clock_state(spark: SparkSession, registry: TableRegistry) -> ClockState:
    """The pipeline clock from ``ops.watermarks`` (a snapshot) and the
    ``ops.watermark_history`` steps from its version on (Delta skips the files of
    older steps by their statistics), by the rule of :func:`clock_state`."""
    pipeline = registry.config.name
    watermarks, watermark_history = registry.ops["watermarks"].path, registry.ops["watermark_history"].path
    if never_written(spark, watermarks) and never_written(spark, watermark_history):
        # A new lakehouse: reading two empty tables would cost Spark jobs for nothing.
        return clock_state([], [])
    clocks = spark.read.format("delta").load(watermarks)
    snapshot = [
        row.asDict()
        for row in clocks.where(F.col("pipeline") == pipeline)
        .select(
            "source_partition",
            F.unix_millis("max_event_time").alias("max_event_ms"),
            "partition_watermark",
            F.unix_millis("last_data_at").alias("last_data_ms"),
            "is_idle",
            "is_aligned",
            "batch_id",
            # Written before custom generators existed: the column comes with the first new snapshot.
            F.col("generator_state") if "generator_state" in clocks.columns else F.lit(None).cast("string"),
        )
        .collect()
    ]
    history = spark.read.format("delta").load(watermark_history)
    steps = history.where(F.col("pipeline") == pipeline)
    held = snapshot_version(snapshot)
    if held is not None:
        steps = steps.where(F.col("batch_id") >= F.lit(held))
    # Written before the clocks moved into the history: the column comes with the first new step.
    partition_clocks = (
        F.col("partition_clocks")
        if "partition_clocks" in history.columns
        else F.lit(None).cast(PARTITION_CLOCKS_TYPE)
    )
    found = steps.select(
        "batch_id",
        "watermark",
        F.unix_millis("processing_time").alias("processing_ms"),
        partition_clocks.alias("partition_clocks"),
    ).collect()
    return clock_state(snapshot, [row.asDict(recursive=True) for row in found])


def load_clock(spark: SparkSession, registry: TableRegistry) -> SavedClock:
    """The pipeline clock as the last recorded step left it, ready to advance."""
    state = read_clock_state(spark, registry)
    tracker = WatermarkTracker(
        registry.config.watermark, MIN_WATERMARK if state.watermark is None else state.watermark
    )
    for partition in state.partitions:
        tracker.restore(partition)
    return SavedClock(
        tracker, state.judged_version, state.snapshot_stale, state.last_step_batch, state.recorded_ms
    )


class ClockMemory:
    """The pipeline clock as a stream's last batch left it, kept on the driver
    between batches and between runs of the stream in one process (DESIGN §4b):
    reading it back costs two table reads (the second only of the steps from the
    snapshot's version on). It is read again on the stream's first batch in a process, after a
    batch that failed, and whenever another writer (an idleness check, a flush, a
    maintenance job) has committed to the pipeline's clocks since, which the
    tables' logs tell without a Spark job."""

    def __init__(self) -> None:
        self.saved: SavedClock | None = None
        self.versions: dict[str, int] = {}

    def recall(self, spark: SparkSession, registry: TableRegistry, own: frozenset[str]) -> SavedClock:
        """The saved clock; ``own`` are the app ids of this stream's own clock writes."""
        paths = (registry.ops["watermarks"].path, registry.ops["watermark_history"].path)
        # Versions first: a commit landing during a read is then looked at again next time.
        current = {path: table_version(spark, path) for path in paths}
        partition = ("pipeline", frozenset({registry.config.name}))
        changed = (
            changed_by_others(spark, path, self.versions[path], current[path], partition, own)
            for path in paths
        )
        if self.saved is None or any(changed):
            self.saved = load_clock(spark, registry)
        self.versions = current
        return self.saved

    def keep(self, saved: SavedClock) -> None:
        self.saved = saved

    def forget(self) -> None:
        self.saved = None


# Per stream (its app id), lakehouse and watermark settings: a replay runs silver
# once per micro-batch in one process.
_CLOCK_MEMORIES: dict[tuple[str, str, str], ClockMemory] = {}


def clock_memory(app_id: str, registry: TableRegistry) -> ClockMemory:
    """The clock memory of the stream ``app_id`` on this lakehouse and watermark settings."""
    place = (app_id, registry.ops["watermarks"].path, repr(registry.config.watermark))
    return _CLOCK_MEMORIES.setdefault(place, ClockMemory())


def history_label(app_id: str) -> str:
    """The label of the silver stream ``app_id``'s watermark history steps."""
    return f"{app_id}:history"


def snapshot_label(app_id: str) -> str:
    """The label of the silver stream ``app_id``'s ``ops.watermarks`` snapshots."""
    return f"{app_id}:watermarks"


def recall_stream_clock(spark: SparkSession, registry: TableRegistry, app_id: str) -> SavedClock:
    """The clock the silver stream ``app_id`` last committed, from this process's
    memory when it has one that no other writer's commit has outdated; else read back."""
    own = frozenset({history_label(app_id), snapshot_label(app_id)})
    return clock_memory(app_id, registry).recall(spark, registry, own)


def forget_clocks() -> None:
    """Forget every stream's clocks kept in this process, as a new process starts."""
    _CLOCK_MEMORIES.clear()
    _BACKLOG.clear()


def utc_moment(millis: int | None) -> datetime | None:
    return None if millis is None else datetime.fromtimestamp(millis / 1000, UTC)


def plan_clocks(
    tracker: WatermarkTracker,
    summary: Sequence[Summary],
    later_backlog: set[str],
    reports: Mapping[int, SourceProgress] | None = None,
) -> list[VersionClock]:
    """Advance ``tracker`` through the versions of ``summary`` in order.

    Before each version is judged, every partition the source has reported up to
    it is declared (a silent one holds the watermark at -inf). A partition has a
    backlog, and is never idle, while it still has records in a later version (of
    this trigger, or already in bronze beyond it) or the source reported unread
    input for it (Kafka lag) at this version or a later one of the trigger."""
    reports = reports or {}
    versions = sorted({row.version for row in summary})
    by_version: dict[int, dict[str, PartitionInput]] = {v: {} for v in versions}
    processing: dict[int, int] = {}
    for row in summary:
        by_version[row.version][row.source_partition] = row.sent
        processing[row.version] = max(processing.get(row.version, row.processing_ms), row.processing_ms)
    plan = []
    for index, version in enumerate(versions):
        known = known_partitions(report for at, report in reports.items() if at <= version)
        tracker.declare(sorted(known, key=partition_order), processing[version])
        backlog = set(later_backlog) | lagging_partitions(
            report for at, report in reports.items() if at >= version
        )
        for later in versions[index + 1 :]:
            backlog.update(by_version[later])
        before = tracker.watermark
        state = tracker.advance(processing[version], by_version[version], backlog)
        plan.append(
            VersionClock(
                version,
                processing[version],
                before,
                state.watermark,
                state.active_partitions,
                state.idle_partitions,
            )
        )
    return plan


def history_rows(
    registry: TableRegistry,
    plan: Sequence[VersionClock],
    counts: dict[int, tuple[int, int]],
    tracker: WatermarkTracker | None,
) -> list[tuple]:
    """The ``ops.watermark_history`` rows of ``plan``'s watermark steps; the last one
    carries ``tracker``'s partition clocks (the clocks after the step), if given."""
    clocks = None if tracker is None else [clock_entry(snapshot) for snapshot in tracker.snapshots()]
    return [
        (
            registry.config.name,
            clock.version,
            clock.watermark_after,
            clock.active_partitions,
            clock.idle_partitions,
            counts.get(clock.version, (0, 0))[0],
            counts.get(clock.version, (0, 0))[1],
            utc_moment(clock.processing_ms),
            clocks if index == len(plan) - 1 else None,
        )
        for index, clock in enumerate(plan)
    ]


def append_history(
    spark: SparkSession,
    registry: TableRegistry,
    rows: Sequence[tuple],
    label: str,
    txn: tuple[str, int] | None,
) -> None:
    """Append ``rows`` to ``ops.watermark_history``, labelled ``label`` (userMetadata),
    once under ``txn`` (app id, version) if given: a few rows, written from the driver
    (:meth:`~spark_jobs.lakehouse.transaction.Transaction.write_rows`, no Spark job). A history
    table written before ``partition_clocks`` existed gains the column with its first
    step, through Spark's writer with the schema merged."""
    table = registry.ops["watermark_history"]
    written = Transaction(spark, table.path)
    if txn is not None and written.has_committed(*txn):
        return
    try:
        written.commit_append(written.write_rows(rows, table.schema), label, txn)
    except MissingColumns:
        writer = (
            local_rows(spark, rows, table.schema)
            .write.format("delta")
            .mode("append")
            .option("mergeSchema", "true")
            .option("userMetadata", label)
        )
        if txn is not None:
            writer = writer.option("txnAppId", txn[0]).option("txnVersion", txn[1])
        writer.save(table.path)


def write_history(
    spark: SparkSession,
    registry: TableRegistry,
    plan: Sequence[VersionClock],
    app_id: str,
    batch_id: int,
    tracker: WatermarkTracker | None = None,
) -> None:
    """A watermark step without records (idleness, end of input), with ``tracker``'s
    partition clocks if given: once under (``app_id``, ``batch_id``)."""
    label = f"{app_id}:history"
    append_history(spark, registry, history_rows(registry, plan, {}, tracker), label, (label, batch_id))


def append_batch_history(
    spark: SparkSession,
    registry: TableRegistry,
    plan: Sequence[VersionClock],
    counts: dict[int, tuple[int, int]],
    tracker: WatermarkTracker,
    label: str,
) -> None:
    """A silver batch's history rows with the partition clocks after it: the batch's
    one clock commit. Not through a Delta transaction id: it needs none, as a batch
    whose history committed is judged, and its replay is skipped by the judged version
    before it writes anything. The commit carries ``label`` as
    userMetadata, so the stream knows it for its own."""
    append_history(spark, registry, history_rows(registry, plan, counts, tracker), label, None)


def partition_clock_rows(
    registry: TableRegistry, tracker: WatermarkTracker, last_version: int, now: datetime
) -> list[tuple]:
    """The pipeline's ``ops.watermarks`` rows: one per partition the tracker knows,
    stamped with the last judged version."""
    return [
        (
            registry.config.name,
            str(snapshot.partition),
            utc_moment(snapshot.max_timestamp),
            snapshot.watermark,
            snapshot.is_idle,
            snapshot.is_aligned,
            utc_moment(snapshot.last_data_at),
            last_version,
            now,
            snapshot.generator_state,
        )
        for snapshot in tracker.snapshots()
    ]


def write_partition_clocks(
    spark: SparkSession,
    registry: TableRegistry,
    tracker: WatermarkTracker,
    last_version: int,
    txn: tuple[str, int],
    now: datetime,
    never_back: bool = False,
) -> None:
    """The snapshot of the pipeline's clocks in ``ops.watermarks`` (shared by every
    pipeline, partitioned by pipeline), labelled with ``txn``'s app id. Readers take
    the steps recorded since it too, so a snapshot behind them is stale, never wrong.

    Silver replaces the pipeline's rows: one commit naming the files it replaces,
    which its process knows from its last refresh (:class:`PartitionWriter`), as
    costly as an append. A refresh repeated after a crash writes the same snapshot
    again. An idleness step (``never_back``) merges row by row instead, idempotent
    under ``txn`` (app id, version), never over a row of a later judged version, so
    a step planned before a silver batch committed leaves the snapshot no further
    behind than it was."""
    rows = partition_clock_rows(registry, tracker, last_version, now)
    if not rows:
        return
    table = registry.ops["watermarks"]
    path = table.path
    name = registry.config.name

    def replace() -> None:
        try:
            partition_writer(path, "pipeline", frozenset({name})).replace_rows(
                spark, rows, table.schema, txn[0]
            )
        except MissingColumns:  # a table written before generator_state: it gains the column
            (
                local_rows(spark, rows, table.schema)
                .write.format("delta")
                .mode("overwrite")
                .option("mergeSchema", "true")
                .option("replaceWhere", f"pipeline = {string_literal(name)}")
                .option("userMetadata", txn[0])
                .save(path)
            )

    def merge() -> None:
        target = DeltaTable.forPath(spark, path).alias("t")
        with delta_txn(spark, *txn):
            (
                target.merge(
                    local_rows(spark, rows, table.schema).alias("s"),
                    (F.col("t.pipeline") == F.lit(name))
                    & (F.col("t.pipeline") == F.col("s.pipeline"))
                    & (F.col("t.source_partition") == F.col("s.source_partition")),
                )
                .whenMatchedUpdateAll(condition=F.col("s.batch_id") >= F.col("t.batch_id"))
                .whenNotMatchedInsertAll()
                .withSchemaEvolution()
                .execute()
            )

    retry_on_conflict(merge if never_back else replace, "ops.watermarks write")


# Delta operations that rearrange a table's files and change no row.
REARRANGING = frozenset({"OPTIMIZE", "VACUUM START", "VACUUM END"})
# Per bronze table, the partitions each version beyond silver's last trigger wrote, as
# read from the log: a trigger reads only the versions the one before it had not seen,
# so a catch-up read in many triggers costs what its versions cost, once.
_BACKLOG: dict[str, dict[int, frozenset[str] | None]] = {}


def backlog_beyond(spark: SparkSession, registry: TableRegistry, last_version: int, latest: int) -> set[str]:
    """Partitions with records already in bronze beyond ``last_version`` (not yet
    read by silver): a slow partition in a backfill is never idle. Each bronze commit
    names them in its label, read from the log without a Spark job; a commit that
    rearranges files (OPTIMIZE) names none; a commit that does not say (an older
    bronze's) makes this read the change feed of the versions beyond instead."""
    path = registry.bronze.path
    known = _BACKLOG.setdefault(path, {})
    for version in [version for version in known if version <= last_version or version > latest]:
        del known[version]
    unread = max([last_version, *known]) + 1
    for commit in commits(spark, path, unread, latest):
        written = written_partitions(commit.user_metadata)
        known[commit.version] = frozenset() if commit.operation in REARRANGING else written
    if len(known) == latest - last_version and all(found is not None for found in known.values()):
        return set().union(*known.values())
    later = change_feed(spark.read, path, last_version + 1, latest).select("source_partition").distinct()
    return {row.source_partition for row in later.collect()}


def judged_version(spark: SparkSession, registry: TableRegistry) -> int | None:
    """The last bronze version silver has judged (None before its first batch)."""
    return read_clock_state(spark, registry).judged_version
