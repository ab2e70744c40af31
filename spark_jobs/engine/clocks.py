"""The pipeline clock on the Spark side: planned on the driver through the shared
:class:`WatermarkTracker`, persisted as ``ops.watermark_history`` (a row per
watermark step) and ``ops.watermarks`` (a row per source partition), read back
on start, and kept in memory between a stream's batches (DESIGN §4b)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.engine.judging import Summary
from spark_jobs.eventtime.clock import MAX_WATERMARK, MIN_WATERMARK
from spark_jobs.eventtime.tracker import PartitionInput, PartitionSnapshot, WatermarkTracker
from spark_jobs.jobs.common import (
    delta_txn,
    idempotent_append,
    retry_on_conflict,
)
from spark_jobs.sources.progress import SourceProgress, known_partitions, lagging_partitions, partition_order
from spark_jobs.sql import local_rows, string_literal
from spark_jobs.tables import TableRegistry, change_feed, changed_by_others, never_written, table_version


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
    """The pipeline clock as the last committed silver batch left it, and the last
    bronze version that batch judged (None before silver's first batch).

    ``unfinished_step_ms`` is the moment of an idleness step whose history row
    committed and whose partition clocks did not (the process died in between):
    repeated at the same moment, its writes are skipped by their transaction ids and
    its clocks land, so the step is neither lost nor recorded twice."""

    tracker: WatermarkTracker
    judged_version: int | None
    unfinished_step_ms: int | None = None
    recorded_beyond: int | None = None

    def may_hold_history_of(self, first_version: int) -> bool:
        """Whether ``ops.watermark_history`` held, when this clock was read, rows of
        version ``first_version`` or later: rows beyond the judged version are a
        batch that died between its history and its clocks, or the end of input."""
        return self.recorded_beyond is not None and self.recorded_beyond >= first_version


def committed_steps(judged_version: int | None) -> F.Column:
    """The ``ops.watermark_history`` rows of watermark steps whose partition clocks
    committed. A silver batch appends its history rows before it merges its clocks,
    so rows beyond the last judged version belong to a batch that died in between:
    its replay must start from the watermark before them, or it would judge its own
    records against its own watermark-after. The end of input (+inf) is final."""
    judged = F.col("batch_id") <= F.lit(-1 if judged_version is None else judged_version)
    return judged | (F.col("watermark") == F.lit(MAX_WATERMARK))


def load_clock(spark: SparkSession, registry: TableRegistry) -> SavedClock:
    """The pipeline clock as the last committed silver batch (or watermark step) left it."""
    pipeline = registry.config.name
    watermarks, watermark_history = registry.ops["watermarks"].path, registry.ops["watermark_history"].path
    if never_written(spark, watermarks) and never_written(spark, watermark_history):
        # A new lakehouse: reading two empty tables would cost 2 s warm, 7 s in a new process.
        return SavedClock(WatermarkTracker(registry.config.watermark, MIN_WATERMARK), None)
    clocks = spark.read.format("delta").load(watermarks)
    saved = clocks.where(F.col("pipeline") == pipeline).select(
        "source_partition",
        F.unix_millis("max_event_time").alias("max_timestamp"),
        "partition_watermark",
        F.unix_millis("last_data_at").alias("last_data_at"),
        "is_idle",
        "is_aligned",
        "batch_id",
        F.unix_millis("updated_at").alias("updated_ms"),
    )
    rows = saved.collect()
    judged = max((row.batch_id for row in rows), default=None)
    clocks_written = max((row.updated_ms for row in rows), default=None)
    history = spark.read.format("delta").load(watermark_history)
    steps = history.where(F.col("pipeline") == pipeline)
    if judged is not None:
        # Watermarks never go back, and the judged version's own step is committed:
        # the steps before it cannot hold the latest, and Delta skips their files.
        steps = steps.where(F.col("batch_id") >= F.lit(judged))
    committed = committed_steps(judged)
    step_ms = F.unix_millis("processing_time")
    # An idleness step judges no records, and is not the end of input.
    unfinished = (
        committed
        & (step_ms > F.lit(clocks_written))
        & (F.col("on_time_count") + F.col("late_count") == 0)
        & (F.col("watermark") != F.lit(MAX_WATERMARK))
    )
    beyond = F.col("batch_id") > F.lit(-1 if judged is None else judged)
    latest, unfinished_ms, recorded_beyond = steps.agg(
        F.max(F.when(committed, F.col("watermark"))),
        F.max(F.when(unfinished, step_ms)),
        F.max(F.when(beyond, F.col("batch_id"))),
    ).first()
    tracker = WatermarkTracker(registry.config.watermark, MIN_WATERMARK if latest is None else latest)
    for row in rows:
        tracker.restore(PartitionSnapshot(*row[:-2]))
    return SavedClock(tracker, judged, unfinished_ms, recorded_beyond)


class ClockMemory:
    """The pipeline clock as a stream's last batch left it, kept on the driver
    between batches and between runs of the stream in one process (DESIGN §4b):
    reading it back costs two table reads (the second only of the steps from the
    last judged version on). It is read again on the stream's first batch in a process, after a
    batch that failed, and whenever another writer (an idleness check, a flush, a
    maintenance job) has committed to the pipeline's clocks since, which the
    tables' logs tell without a Spark job."""

    def __init__(self) -> None:
        self.saved: SavedClock | None = None
        self.versions: dict[str, int] = {}
        # True while the saved clock is the one this stream's last batch committed
        # and kept, with no other writer since.
        self.follows_own_batch = False

    def recall(self, spark: SparkSession, registry: TableRegistry, own: frozenset[str]) -> SavedClock:
        """The saved clock; ``own`` are the app ids of this stream's own clock writes."""
        paths = (registry.ops["watermarks"].path, registry.ops["watermark_history"].path)
        # Versions first: a commit landing during a read is then looked at again next time.
        current = {path: table_version(spark, path) for path in paths}
        partition = ("pipeline", registry.config.name)
        changed = (
            changed_by_others(spark, path, self.versions[path], current[path], partition, own)
            for path in paths
        )
        if self.saved is None or any(changed):
            self.saved = load_clock(spark, registry)
            self.follows_own_batch = False
        self.versions = current
        return self.saved

    def keep(self, saved: SavedClock) -> None:
        self.saved = saved
        self.follows_own_batch = True

    def forget(self) -> None:
        self.saved = None
        self.follows_own_batch = False


# Per stream (its app id), lakehouse and watermark settings: a replay runs silver
# once per micro-batch in one process.
_CLOCK_MEMORIES: dict[tuple[str, str, str], ClockMemory] = {}


def clock_memory(app_id: str, registry: TableRegistry) -> ClockMemory:
    """The clock memory of the stream ``app_id`` on this lakehouse and watermark settings."""
    place = (app_id, registry.ops["watermarks"].path, repr(registry.config.watermark))
    return _CLOCK_MEMORIES.setdefault(place, ClockMemory())


def forget_clocks() -> None:
    """Forget every stream's clocks kept in this process, as a new process starts."""
    _CLOCK_MEMORIES.clear()


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
    versions = sorted({row[0] for row in summary})
    by_version: dict[int, dict[str, PartitionInput]] = {v: {} for v in versions}
    processing: dict[int, int] = {}
    for version, partition, max_ts, max_marker, processing_ms, _ in summary:
        by_version[version][partition] = PartitionInput(max_ts, max_marker)
        processing[version] = max(processing.get(version, processing_ms), processing_ms)
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
    registry: TableRegistry, plan: Sequence[VersionClock], counts: dict[int, tuple[int, int]]
) -> list[tuple]:
    """The ``ops.watermark_history`` rows of ``plan``'s watermark steps."""
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
        )
        for clock in plan
    ]


def write_history(
    spark: SparkSession,
    registry: TableRegistry,
    plan: Sequence[VersionClock],
    counts: dict[int, tuple[int, int]],
    app_id: str,
    batch_id: int,
) -> None:
    """A watermark step's history rows, idempotent under (``app_id``, ``batch_id``)."""
    table = registry.ops["watermark_history"]
    rows = local_rows(spark, history_rows(registry, plan, counts), table.schema)
    idempotent_append(rows, table, f"{app_id}:history", batch_id)


def append_batch_history(
    spark: SparkSession,
    registry: TableRegistry,
    plan: Sequence[VersionClock],
    counts: dict[int, tuple[int, int]],
    label: str,
    known_new: bool,
) -> None:
    """A silver batch's history rows, appended once however often the batch runs.

    Not through a Delta transaction id: checking one rebuilds the table's state from
    its log on every append (three Spark jobs, 0.4 s of a 5 s batch). ``known_new``
    when they cannot be there: the batch follows a batch this stream committed in
    this process with no other writer in between (a failed attempt makes the stream
    read its clocks again), or the history held no rows beyond the judged version
    when the clocks were read. Otherwise (a replay after a crash between the history
    and the clocks, or an end of input recorded beyond) its rows are looked for:
    they are fully determined by the plan, processing times included, which no
    other step shares. The commit carries ``label`` as userMetadata, so the stream
    knows it for its own."""
    table = registry.ops["watermark_history"]
    rows = history_rows(registry, plan, counts)
    if not known_new and history_recorded(spark, registry, rows):
        return
    local_rows(spark, rows, table.schema).write.format("delta").mode("append").option(
        "userMetadata", label
    ).save(table.path)


def history_recorded(spark: SparkSession, registry: TableRegistry, rows: Sequence[tuple]) -> bool:
    """Whether ``ops.watermark_history`` holds every one of ``rows`` (a Delta append
    commits all its rows or none)."""
    versions = [row[1] for row in rows]
    history = spark.read.format("delta").load(registry.ops["watermark_history"].path)
    found = history.where(
        (F.col("pipeline") == registry.config.name) & F.col("batch_id").between(min(versions), max(versions))
    ).select(*(F.unix_millis(c) if c == "processing_time" else c for c in history.columns))
    held = {tuple(row) for row in found.collect()}
    wanted = {(*row[:-1], None if row[-1] is None else round(row[-1].timestamp() * 1000)) for row in rows}
    return wanted <= held


def partition_clock_rows(
    spark: SparkSession, registry: TableRegistry, tracker: WatermarkTracker, last_version: int, now: datetime
) -> DataFrame | None:
    """The pipeline's ``ops.watermarks`` rows: one per partition the tracker knows
    (None when it knows none), stamped with the last judged version."""
    table = registry.ops["watermarks"]
    rows = [
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
        )
        for snapshot in tracker.snapshots()
    ]
    return local_rows(spark, rows, table.schema) if rows else None


def write_partition_clocks(
    spark: SparkSession,
    registry: TableRegistry,
    tracker: WatermarkTracker,
    last_version: int,
    txn: tuple[str, int],
    now: datetime,
    never_back: bool = False,
) -> None:
    """The pipeline's rows of ``ops.watermarks`` (shared by every pipeline,
    partitioned by pipeline), idempotent under ``txn`` (app id, version).

    A silver batch replaces the pipeline's rows: it judged later versions than any
    clock written before it, and an overwrite of one partition costs less than a
    MERGE (no join). An idleness step (``never_back``) merges row by row instead,
    never over a newer row: planned before a silver batch committed, it must not
    overwrite the clocks that batch moved on."""
    rows = partition_clock_rows(spark, registry, tracker, last_version, now)
    if rows is None:
        return
    path = registry.ops["watermarks"].path
    name = registry.config.name

    def replace() -> None:
        (
            rows.write.format("delta")
            .mode("overwrite")
            .option("replaceWhere", f"pipeline = {string_literal(name)}")
            .option("txnAppId", txn[0])
            .option("txnVersion", txn[1])
            .save(path)
        )

    def merge() -> None:
        target = DeltaTable.forPath(spark, path).alias("t")
        with delta_txn(spark, *txn):
            (
                target.merge(
                    rows.alias("s"),
                    (F.col("t.pipeline") == F.lit(name))
                    & (F.col("t.pipeline") == F.col("s.pipeline"))
                    & (F.col("t.source_partition") == F.col("s.source_partition")),
                )
                .whenMatchedUpdateAll(condition=F.col("s.batch_id") >= F.col("t.batch_id"))
                .whenNotMatchedInsertAll()
                .execute()
            )

    retry_on_conflict(merge if never_back else replace, "ops.watermarks write")


def backlog_beyond(spark: SparkSession, registry: TableRegistry, last_version: int, latest: int) -> set[str]:
    """Partitions with records already in bronze beyond ``last_version`` (not yet
    read by silver): a slow partition in a backfill is never idle."""
    if latest <= last_version:
        return set()
    later = (
        change_feed(spark.read, registry.bronze.path, last_version + 1, latest)
        .select("source_partition")
        .distinct()
    )
    return {row.source_partition for row in later.collect()}


def last_history_batch(spark: SparkSession, registry: TableRegistry) -> int | None:
    history = spark.read.format("delta").load(registry.ops["watermark_history"].path)
    return history.where(F.col("pipeline") == registry.config.name).agg(F.max("batch_id")).first()[0]


def judged_version(spark: SparkSession, registry: TableRegistry) -> int | None:
    """The last bronze version silver has judged (None before its first batch)."""
    clocks = spark.read.format("delta").load(registry.ops["watermarks"].path)
    return clocks.where(F.col("pipeline") == registry.config.name).agg(F.max("batch_id")).first()[0]
