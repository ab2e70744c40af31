"""Silver: bronze stream -> watermark bookkeeping -> windows -> silver, quarantine, ops.

The event-time micro-batch is the bronze commit: silver reads bronze's change
feed, so every record carries the bronze version (the source micro-batch) that
brought it. However many bronze commits one silver trigger picks up, each is
judged and advances the watermark on its own, so silver's results do not depend
on how often silver itself runs, nor on restarts.

Per silver trigger:
1. per (bronze version, source partition): largest timestamp, largest marker,
   processing time: a tiny table, collected to the driver;
2. on the driver, the shared :class:`WatermarkTracker` (rebuilt from
   ``ops.watermarks``) walks the versions in order: watermark before and after
   each, active and idle partitions;
3. in Spark: assign windows, judge every (record, window) pair against its
   version's starting watermark, pre-aggregate on-time pairs per (window, key);
4. writes, each idempotent under a replay of the same trigger (Delta txn app
   id/version): quarantine append, silver MERGE (partials, revisions, firing
   and closing), watermark history append, and ``ops.watermarks`` last, so a
   crash anywhere before it replays from the same starting clocks.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.catalog import string_literal
from spark_jobs.config import ConfigError
from spark_jobs.eventtime.clock import MAX_WATERMARK, MIN_WATERMARK
from spark_jobs.eventtime.tracker import PartitionInput, PartitionSnapshot, WatermarkTracker
from spark_jobs.jobs.bronze import idempotent_append
from spark_jobs.jobs.common import (
    BatchWriter,
    JobContext,
    Stream,
    crash_point,
    delta_txn,
    exit_on_config_error,
    job_parser,
    retry_on_conflict,
    run_stream,
    writer_stream,
)
from spark_jobs.session import build_session
from spark_jobs.sources import source_reports
from spark_jobs.sources.progress import SourceProgress, known_partitions, lagging_partitions, partition_order
from spark_jobs.sql import column_of, local_rows, null_safe_match
from spark_jobs.tables import TableRegistry, changed_by_others, never_written, table_version
from spark_jobs.transforms.aggregates import finished_measures, merged_measures
from spark_jobs.transforms.windows import (
    assign_windows,
    in_play,
    is_cleaned,
    is_fired,
    is_marker,
    judge_pairs,
    record_millis,
    revision_columns,
    window_partials,
    window_status,
)

LATE_REASON = "window_cleaned"
# (version, partition, max data ts, max marker, processing ms, rows)
Summary = tuple[int, str, int | None, int | None, int, int]


@dataclass(frozen=True)
class VersionClock:
    """The pipeline clock around one bronze version (one event-time micro-batch)."""

    version: int
    processing_ms: int
    watermark_before: int
    watermark_after: int
    active_partitions: int
    idle_partitions: int


def read_bronze_changes(spark: SparkSession, registry: TableRegistry) -> DataFrame:
    """Bronze as a stream of inserts, each tagged with its bronze commit ``version``."""
    return (
        spark.readStream.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 0)
        .load(registry.bronze.path)
        .where(F.col("_change_type") == "insert")
        .withColumnRenamed("_commit_version", "version")
        .drop("_change_type", "_commit_timestamp")
    )


def timed_records(changes: DataFrame, registry: TableRegistry) -> DataFrame:
    """Bronze rows with ``ts_ms`` (the time characteristic) and ``is_marker``."""
    config = registry.config
    return changes.withColumn("ts_ms", record_millis(config)).withColumn("is_marker", is_marker(config))


def version_summary(records: DataFrame) -> list[Summary]:
    """Per bronze version and partition, what the watermark generators need."""
    rows = (
        records.groupBy("version", "source_partition")
        .agg(
            F.max(F.when(~F.col("is_marker"), F.col("ts_ms"))).alias("max_ts"),
            F.max(F.when(F.col("is_marker"), F.col("ts_ms"))).alias("max_marker"),
            F.max(F.unix_millis("processing_time")).alias("processing_ms"),
            F.count(F.lit(1)).alias("rows"),
        )
        .collect()
    )
    return sorted(
        (r.version, r.source_partition, r.max_ts, r.max_marker, r.processing_ms, r.rows) for r in rows
    )


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
    steps = history.where((F.col("pipeline") == pipeline) & committed_steps(judged))
    if judged is not None:
        # Watermarks never go back, and the judged version's own step is committed:
        # the steps before it cannot hold the latest, and Delta skips their files.
        steps = steps.where(F.col("batch_id") >= F.lit(judged))
    step_ms = F.unix_millis("processing_time")
    # An idleness step judges no records, and is not the end of input.
    unfinished = (
        (step_ms > F.lit(clocks_written))
        & (F.col("on_time_count") + F.col("late_count") == 0)
        & (F.col("watermark") != F.lit(MAX_WATERMARK))
    )
    latest, unfinished_ms = steps.agg(F.max("watermark"), F.max(F.when(unfinished, step_ms))).first()
    tracker = WatermarkTracker(registry.config.watermark, MIN_WATERMARK if latest is None else latest)
    for row in rows:
        tracker.restore(PartitionSnapshot(*row[:-2]))
    return SavedClock(tracker, judged, unfinished_ms)


class ClockMemory:
    """The pipeline clock as a stream's last batch left it, kept on the driver
    between batches and between runs of the stream in one process (DESIGN §4b):
    reading it back costs two table reads, one of them over the whole watermark
    history. It is read again on the stream's first batch in a process, after a
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
        partition = ("pipeline", registry.config.name)
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


def forget_clocks() -> None:
    """Forget every stream's clocks kept in this process, as a new process starts."""
    _CLOCK_MEMORIES.clear()


def _moment(millis: int | None) -> datetime | None:
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


def firing_update(
    watermark: int, lateness_ms: int, target: str | None = None
) -> tuple[F.Column, dict[str, F.Column]]:
    """For silver rows that received nothing: (condition, assignments) that fire the
    windows ``watermark`` has passed (revision 0 -> 1) and close the ones past their
    allowed lateness. Rows already fired and not yet due to close are left alone.
    ``target`` qualifies the columns (a MERGE's target alias)."""

    def column(name: str) -> F.Column:
        return F.col(name) if target is None else column_of(target, name)

    end_ms = F.unix_millis(column("window_end"))
    fires = is_fired(end_ms, watermark) & (column("revision") == 0)
    condition = in_play(column("status")) & (fires | is_cleaned(end_ms, watermark, lateness_ms))
    revision = F.greatest(column("revision"), F.lit(1))
    return condition, {
        "revision": revision,
        "status": window_status(revision, end_ms, watermark, lateness_ms),
    }


def due_windows(spark: SparkSession, registry: TableRegistry, watermark: int) -> DataFrame:
    """The keys of the silver windows ``watermark`` fires or closes."""
    due, _ = firing_update(watermark, registry.config.allowed_lateness_ms)
    windows = spark.read.format("delta").load(registry.silver.path)
    return windows.where(due).select("window_start", "window_end", *registry.config.key)


def merge_windows(
    spark: SparkSession,
    registry: TableRegistry,
    partials: DataFrame,
    plan: Sequence[VersionClock],
    app_id: str,
    batch_id: int,
    now: datetime,
) -> None:
    """One MERGE: add partials (insert or merge), move revisions, fire windows the
    watermark has passed and close the ones past their allowed lateness.

    The windows that fire or close without receiving records join the MERGE's
    source, flagged ``fires_only``, rather than being found by a ``WHEN NOT MATCHED
    BY SOURCE`` clause, which would make Delta read the whole table on every batch.
    The target side is limited to the windows in play, whose partitions are all
    Delta reads (DESIGN §4b)."""
    config = registry.config
    lateness = config.allowed_lateness_ms
    key = config.key
    window_key = ("window_start", "window_end", *key)
    final_watermark = plan[-1].watermark_after
    moment = F.lit(now).cast("timestamp")
    partials = partials.select(
        "*",
        F.timestamp_millis("window_start_ms").alias("window_start"),
        F.timestamp_millis("window_end_ms").alias("window_end"),
        *revision_columns([clock.version for clock in plan], [clock.watermark_after for clock in plan]),
        F.lit(False).alias("fires_only"),
    )
    source_end = F.unix_millis(F.col("s.window_end"))
    matched_revision = F.when(F.col("t.revision") >= 1, F.col("t.revision") + F.col("s.refires")).otherwise(
        F.col("s.revision_if_open")
    )
    _, fired = firing_update(final_watermark, lateness, target="t")
    # A partial never matches a closed window: its records would have been late.
    condition = null_safe_match(window_key) & in_play(F.col("t.status"))
    merged = merged_measures(config)
    finished = finished_measures(config)

    def merge() -> None:
        quiet = due_windows(spark, registry, final_watermark).alias("d")
        quiet = quiet.join(partials.alias("p"), null_safe_match(window_key, "d", "p"), "left_anti")
        source = partials.unionByName(quiet.withColumn("fires_only", F.lit(True)), allowMissingColumns=True)
        target = DeltaTable.forPath(spark, registry.silver.path).alias("t")
        with delta_txn(spark, f"{app_id}:silver", batch_id):
            (
                target.merge(source.alias("s"), condition)
                .whenMatchedUpdate(condition=F.col("s.fires_only"), set={**fired, "updated_at": moment})
                .whenMatchedUpdate(
                    set={
                        **merged,
                        "revision": matched_revision,
                        "status": window_status(matched_revision, source_end, final_watermark, lateness),
                        "updated_at": moment,
                    }
                )
                .whenNotMatchedInsert(
                    condition=~F.col("s.fires_only"),
                    values={
                        "window_start": F.col("s.window_start"),
                        "window_end": F.col("s.window_end"),
                        **{column: column_of("s", column) for column in key},
                        **finished,
                        "revision": F.col("s.revision_if_new"),
                        "status": window_status(
                            F.col("s.revision_if_new"), source_end, final_watermark, lateness
                        ),
                        "late_merged_count": F.lit(0).cast("long"),
                        "updated_at": moment,
                    },
                )
                .execute()
            )

    retry_on_conflict(merge, "silver MERGE")


def write_history(
    spark: SparkSession,
    registry: TableRegistry,
    plan: Sequence[VersionClock],
    counts: dict[int, tuple[int, int]],
    app_id: str,
    batch_id: int,
) -> None:
    table = registry.ops["watermark_history"]
    rows = [
        (
            registry.config.name,
            clock.version,
            clock.watermark_after,
            clock.active_partitions,
            clock.idle_partitions,
            counts.get(clock.version, (0, 0))[0],
            counts.get(clock.version, (0, 0))[1],
            _moment(clock.processing_ms),
        )
        for clock in plan
    ]
    idempotent_append(local_rows(spark, rows, table.schema), table, f"{app_id}:history", batch_id)


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
            _moment(snapshot.max_timestamp),
            snapshot.watermark,
            snapshot.is_idle,
            snapshot.is_aligned,
            _moment(snapshot.last_data_at),
            last_version,
            now,
        )
        for snapshot in tracker.snapshots()
    ]
    return local_rows(spark, rows, table.schema) if rows else None


def replace_partition_clocks(
    spark: SparkSession,
    registry: TableRegistry,
    tracker: WatermarkTracker,
    last_version: int,
    app_id: str,
    batch_id: int,
    now: datetime,
) -> None:
    """A silver batch's clocks replace the pipeline's rows. The batch judged later
    versions than any clock written before it, so nothing newer is lost; an
    overwrite of the pipeline's partition costs less than a MERGE (no join)."""
    rows = partition_clock_rows(spark, registry, tracker, last_version, now)
    if rows is None:
        return
    writer = (
        rows.write.format("delta")
        .mode("overwrite")
        .option("replaceWhere", f"pipeline = {string_literal(registry.config.name)}")
        .option("txnAppId", f"{app_id}:watermarks")
        .option("txnVersion", batch_id)
    )
    # ops.watermarks is shared by every pipeline (partitioned by pipeline).
    retry_on_conflict(lambda: writer.save(registry.ops["watermarks"].path), "ops.watermarks overwrite")


def merge_partition_clocks(
    spark: SparkSession,
    registry: TableRegistry,
    tracker: WatermarkTracker,
    last_version: int,
    app_id: str,
    batch_id: int,
    now: datetime,
) -> None:
    """An idleness step's clocks, merged row by row and never back: a step planned
    before a silver batch committed must not overwrite the clocks that batch moved on."""
    rows = partition_clock_rows(spark, registry, tracker, last_version, now)
    if rows is None:
        return
    updates = rows.alias("s")

    def merge() -> None:
        target = DeltaTable.forPath(spark, registry.ops["watermarks"].path).alias("t")
        with delta_txn(spark, f"{app_id}:watermarks", batch_id):
            (
                target.merge(
                    updates,
                    (F.col("t.pipeline") == F.lit(registry.config.name))
                    & (F.col("t.pipeline") == F.col("s.pipeline"))
                    & (F.col("t.source_partition") == F.col("s.source_partition")),
                )
                .whenMatchedUpdateAll(condition=F.col("s.batch_id") >= F.col("t.batch_id"))
                .whenNotMatchedInsertAll()
                .execute()
            )

    retry_on_conflict(merge, "ops.watermarks MERGE")


def quarantine_rows(late: DataFrame, registry: TableRegistry, now: datetime) -> DataFrame:
    moment = F.lit(now).cast("timestamp")
    return late.select(
        *registry.bronze.schema.fieldNames(),
        F.timestamp_millis("window_start_ms").alias("window_start"),
        F.timestamp_millis("window_end_ms").alias("window_end"),
        F.col("watermark"),
        (F.col("watermark") - F.col("ts_ms")).alias("lateness_ms"),
        F.lit(LATE_REASON).alias("reason"),
        F.lit("pending").alias("status"),
        moment.alias("quarantined_at"),
        F.lit(None).cast("timestamp").alias("merged_at"),
        F.lit(None).cast("string").alias("merge_run_id"),
    )


def backlog_beyond(spark: SparkSession, registry: TableRegistry, last_version: int, latest: int) -> set[str]:
    """Partitions with records already in bronze beyond ``last_version`` (not yet
    read by silver): a slow partition in a backfill is never idle."""
    if latest <= last_version:
        return set()
    later = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", last_version + 1)
        .option("endingVersion", latest)
        .load(registry.bronze.path)
        .select("source_partition")
        .distinct()
    )
    return {row.source_partition for row in later.collect()}


class SilverBatchWriter(BatchWriter):
    @property
    def clock(self) -> ClockMemory:
        registry = self.context.registry
        place = (self.app_id, registry.ops["watermarks"].path, repr(registry.config.watermark))
        return _CLOCK_MEMORIES.setdefault(place, ClockMemory())

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        try:
            self.write_batch(batch, batch_id)
        except BaseException:
            # The tracker may have moved past what committed.
            self.clock.forget()
            raise

    def write_batch(self, batch: DataFrame, batch_id: int) -> None:
        spark = self.spark
        registry = self.context.registry
        config = registry.config
        now = datetime.now(UTC)
        records = timed_records(batch, registry).persist()
        try:
            summary = version_summary(records)
            if not summary:
                return
            last_version = max(row[0] for row in summary)
            own = frozenset({f"{self.app_id}:history", f"{self.app_id}:watermarks"})
            saved = self.clock.recall(spark, registry, own)
            if saved.judged_version is not None and last_version <= saved.judged_version:
                # A replay of a batch whose every write committed (the partition
                # clocks come last) before Spark logged it. Judged again against the
                # clocks it already moved, its records would look late and reach
                # the quarantine, whose append is skipped by txn id only when the
                # first run had late records to write.
                print(f"tidemark silver: batch {batch_id} was already judged; skipped", file=sys.stderr)
                return
            tracker = saved.tracker
            latest = table_version(spark, registry.bronze.path)
            plan = plan_clocks(
                tracker,
                summary,
                backlog_beyond(spark, registry, last_version, latest),
                # The trigger's own versions only: a replay after a crash, with bronze
                # grown since, must plan exactly as the first run did.
                source_reports(spark, registry, summary[0][0], last_version),
            )
            clocks = local_rows(
                spark,
                [(clock.version, clock.watermark_before) for clock in plan],
                "version long, watermark_before long",
            )
            data = records.where(~F.col("is_marker"))
            # Not cached: each use re-derives the pairs from the cached records, which
            # costs less than caching every bronze column once more per pair.
            pairs = judge_pairs(assign_windows(data, config.window), clocks, config.allowed_lateness_ms)
            counts = {
                (row.version, row.is_late): row["count"]
                for row in pairs.groupBy("version", "is_late").count().collect()
            }
            late_total = sum(n for (_, is_late), n in counts.items() if is_late)
            if late_total:
                idempotent_append(
                    quarantine_rows(pairs.where("is_late"), registry, now),
                    registry.quarantine,
                    f"{self.app_id}:quarantine",
                    batch_id,
                )
                crash_point("silver:quarantine")
            on_time = pairs.where(~F.col("is_late"))
            merge_windows(spark, registry, window_partials(on_time, config), plan, self.app_id, batch_id, now)
            crash_point("silver:windows")
            per_version = {
                clock.version: (counts.get((clock.version, False), 0), counts.get((clock.version, True), 0))
                for clock in plan
            }
            write_history(spark, registry, plan, per_version, self.app_id, batch_id)
            crash_point("silver:history")
            replace_partition_clocks(spark, registry, tracker, last_version, self.app_id, batch_id, now)
            crash_point("silver:clocks")
            self.clock.keep(SavedClock(tracker, last_version))
        finally:
            records.unpersist()
        on_time_total = sum(on for on, _ in per_version.values())
        self.totals.batches += 1
        self.totals.rows_in += sum(row[5] for row in summary)
        self.totals.rows_out += on_time_total
        self.totals.late += late_total


def fire_due(
    spark: SparkSession, registry: TableRegistry, watermark: int, txn: tuple[str, int], now: datetime
) -> None:
    """Fire the windows ``watermark`` has passed and close those past their allowed
    lateness, for a watermark step that brings no records (end of input, idleness)."""
    due, fired = firing_update(watermark, registry.config.allowed_lateness_ms)

    def fire() -> None:
        with delta_txn(spark, *txn):
            DeltaTable.forPath(spark, registry.silver.path).update(
                due, {**fired, "updated_at": F.lit(now).cast("timestamp")}
            )

    retry_on_conflict(fire, "silver firing")


def last_history_batch(spark: SparkSession, registry: TableRegistry) -> int | None:
    history = spark.read.format("delta").load(registry.ops["watermark_history"].path)
    return history.where(F.col("pipeline") == registry.config.name).agg(F.max("batch_id")).first()[0]


def flush(spark: SparkSession, registry: TableRegistry) -> bool:
    """End of input, like a bounded Flink source: the watermark moves to +inf, so
    every window fires and closes. Returns False when it had already ended."""
    registry.create_missing(spark)
    tracker = load_clock(spark, registry).tracker
    if tracker.watermark == MAX_WATERMARK:
        return False
    last = last_history_batch(spark, registry)
    version = -1 if last is None else last
    state = tracker.flush()
    now = datetime.now(UTC)
    app_id = f"flush-{registry.config.name}"
    fire_due(spark, registry, MAX_WATERMARK, (f"{app_id}:silver", version + 1), now)
    crash_point("flush:fire")
    now_ms = round(now.timestamp() * 1000)
    clock = VersionClock(
        version + 1, now_ms, MIN_WATERMARK, MAX_WATERMARK, state.active_partitions, state.idle_partitions
    )
    write_history(spark, registry, [clock], {}, app_id, version + 1)
    crash_point("flush:history")
    return True


def judged_version(spark: SparkSession, registry: TableRegistry) -> int | None:
    """The last bronze version silver has judged (None before its first batch)."""
    clocks = spark.read.format("delta").load(registry.ops["watermarks"].path)
    return clocks.where(F.col("pipeline") == registry.config.name).agg(F.max("batch_id")).first()[0]


def advance_idle(
    spark: SparkSession, registry: TableRegistry, now: datetime, backlog: Iterable[str] = ()
) -> VersionClock | None:
    """A watermark step without records, for when silver is quiet (no bronze
    version left to judge): partitions quiet for the idleness timeout become idle,
    unless they are in ``backlog`` (unread input at the source, such as Kafka lag),
    the watermark moves as the valve says, and the windows it passed fire, through
    the same tracker and firing update as a streaming batch. Recorded as a history
    step on the last judged version. Returns the step, or None if nothing moved
    or the input has ended."""
    saved = load_clock(spark, registry)
    last_version, tracker = saved.judged_version, saved.tracker
    if last_version is None:
        return None
    before = tracker.watermark
    if before == MAX_WATERMARK:  # the input has ended (flushed): there is nothing left to step
        return None
    idle_before = {snapshot.partition for snapshot in tracker.snapshots() if snapshot.is_idle}
    # Whole milliseconds: the step's history row and its clocks carry the same moment.
    now_ms = saved.unfinished_step_ms
    if now_ms is None:
        now_ms = int(now.timestamp() * 1000)
    now = _moment(now_ms)
    state = tracker.advance(now_ms, {}, backlog)
    idle_after = {snapshot.partition for snapshot in tracker.snapshots() if snapshot.is_idle}
    if state.watermark == before and idle_after == idle_before and saved.unfinished_step_ms is None:
        return None
    # Each check is its own step: its moment is its transaction version.
    app_id = f"idle-{registry.config.name}"
    fire_due(spark, registry, state.watermark, (f"{app_id}:silver", now_ms), now)
    crash_point("idle:fire")
    clock = VersionClock(
        last_version, now_ms, before, state.watermark, state.active_partitions, state.idle_partitions
    )
    write_history(spark, registry, [clock], {}, app_id, now_ms)
    crash_point("idle:history")
    merge_partition_clocks(spark, registry, tracker, last_version, app_id, now_ms, now)
    crash_point("idle:clocks")
    return clock


def stream(spark: SparkSession, context: JobContext) -> Stream:
    """Silver's query in this session, ready to start."""
    return writer_stream(
        spark, context, lambda: read_bronze_changes(spark, context.registry), SilverBatchWriter
    )


def run(spark: SparkSession, context: JobContext) -> int:
    """Run silver in this session (replays and benchmarks share one session)."""
    return run_stream(stream(spark, context))


@exit_on_config_error
def main(argv: list[str] | None = None) -> int:
    parser = job_parser("silver", "Event-time windows, quarantine and watermarks from bronze.")
    parser.add_argument(
        "--flush",
        action="store_true",
        help="after an available-now run, end the input: the watermark moves to +inf",
    )
    args = parser.parse_args(argv)
    if args.flush and args.trigger != "available-now":
        # A continuous stream stops when it is told to, which is no end of its input.
        raise ConfigError("--flush", "needs --trigger available-now")
    context = JobContext.from_args("silver", args)
    spark = build_session(f"tidemark-silver-{context.config.name}")
    code = run(spark, context)
    if code == 0 and args.flush:
        flush(spark, context.registry)
    return code


if __name__ == "__main__":
    sys.exit(main())
