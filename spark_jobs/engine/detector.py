"""The offline detector's store: its state table (``last`` rows, buffered tracks,
the clock), the tracks it takes from bronze, the status events it writes, and the
re-derivation of keys the late merge folds late tracks into. The offline stream
and the late merge both drive it; neither reaches into the other."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.engine import claims
from spark_jobs.eventtime.clock import MIN_WATERMARK
from spark_jobs.faults import crash_point
from spark_jobs.lakehouse.log import commits, table_version
from spark_jobs.lakehouse.reads import change_feed
from spark_jobs.lakehouse.table_files import read_latest, rewrite_within
from spark_jobs.lakehouse.transaction import retry_on_conflict
from spark_jobs.sql import column_of, local_rows, null_safe_match, quote_identifier, string_literal
from spark_jobs.tables import TableRef, TableRegistry
from spark_jobs.transforms.offline import changed_state, detection_watermark, transitions
from spark_jobs.transforms.windows import is_marker, record_millis, with_starting_watermark

CLOCK, LAST, BUFFERED = "clock", "last", "buffered"


@dataclass(frozen=True)
class DetectorClock:
    """How far the detector has read: silver's watermark and last bronze version."""

    watermark: int = MIN_WATERMARK
    version: int = -1


@dataclass(frozen=True)
class Steps:
    """A trigger's watermark steps: each new bronze version's starting watermark,
    every watermark reached, and where the detector stands afterwards."""

    starts: dict[int, int]
    watermarks: list[int]
    after: DetectorClock


def offline_tables(registry: TableRegistry) -> tuple[TableRef, TableRef, TableRef]:
    """(status events, state, late tracks); a pipeline without ``offline`` has none."""
    if registry.status_events is None or registry.offline_state is None or registry.late_tracks is None:
        raise ValueError(f"pipeline {registry.config.name!r} has no offline section")
    return registry.status_events, registry.offline_state, registry.late_tracks


def plan_steps(clock: DetectorClock, steps: Sequence[tuple[int, int]]) -> Steps:
    """Walk silver's (bronze version, watermark after) steps in order. Versions the
    detector has read already only move the watermark (an idle or flush step)."""
    watermark, version = clock.watermark, clock.version
    starts: dict[int, int] = {}
    reached = []
    for step_version, step_watermark in sorted(steps):
        if step_version > version:
            starts.setdefault(step_version, watermark)
        watermark = max(watermark, step_watermark)
        reached.append(watermark)
    last_version = max([version, *starts])
    return Steps(starts, reached, DetectorClock(watermark, last_version))


@dataclass(frozen=True)
class StateRead:
    """The detector's state as read at one version of its table: the version tells
    whether another writer committed between this read and a write based on it."""

    rows: DataFrame
    version: int


def read_state(spark: SparkSession, state: TableRef) -> StateRead:
    """The state at the table's latest version (:func:`read_latest`)."""
    rows, version = read_latest(spark, state.path)
    return StateRead(rows.select(*state.schema.fieldNames()), version)


def last_rows(state: DataFrame, key: Sequence[str]) -> DataFrame:
    """Each key's last handled track and status, from the detector's state rows."""
    return state.where(F.col("kind") == LAST).select(*key, "ts_ms", "status")


def detector_clock(state: DataFrame) -> DetectorClock:
    row = state.where(F.col("kind") == CLOCK).select("ts_ms", "version").first()
    return DetectorClock() if row is None else DetectorClock(row.ts_ms, row.version)


def version_tracks(spark: SparkSession, registry: TableRegistry, starts: dict[int, int]) -> DataFrame | None:
    """Bronze data rows of the versions in ``starts``, with ``ts_ms`` and the
    version's starting ``watermark``; None when bronze has none of them yet."""
    if not starts:
        return None
    latest = table_version(spark, registry.bronze.path)
    first, last = min(starts), min(max(starts), latest)
    if first > last:
        return None
    tracks = (
        change_feed(spark.read, registry.bronze.path, first, last)
        .where(F.col("_change_type") == "insert")
        .withColumnRenamed("_commit_version", "version")
        .where(~is_marker(registry.config))
        .withColumn("ts_ms", record_millis(registry.config))
    )
    return with_starting_watermark(tracks, starts)


def late_track_rows(late: DataFrame, registry: TableRegistry, now: datetime) -> DataFrame:
    return late.select(
        *registry.bronze.schema.fieldNames(),
        "watermark",
        (F.col("watermark") - F.col("ts_ms")).alias("lateness_ms"),
        F.lit("pending").alias("status"),
        F.lit(now).cast("timestamp").alias("quarantined_at"),
        F.lit(None).cast("timestamp").alias("merged_at"),
        F.lit(None).cast("string").alias("merge_run_id"),
    )


def event_rows(events: DataFrame, key: Sequence[str], watermarks: Sequence[int], now: datetime) -> DataFrame:
    return events.select(
        *key,
        "status",
        F.timestamp_millis("event_ms").alias("event_time"),
        detection_watermark(F.col("event_ms"), watermarks).alias("watermark"),
        F.lit(now).cast("timestamp").alias("detected_at"),
    )


def last_changes(key: Sequence[str], new_last: DataFrame) -> DataFrame:
    """State changes that ``upsert`` the keys' new last rows."""
    return new_last.select(
        *key,
        F.lit(LAST).alias("kind"),
        "ts_ms",
        "status",
        F.lit("upsert").alias("action"),
        F.lit(None).cast("long").alias("version"),
    )


def state_changes(
    key: Sequence[str],
    new_last: DataFrame,
    buffer: DataFrame,
    arrived: DataFrame,
    clock: DetectorClock,
    spark: SparkSession,
) -> DataFrame:
    """The detector's state changes: ``upsert`` the new last rows and the clock,
    ``delete`` handled buffered tracks, ``insert`` arrived tracks still ahead of
    the watermark."""
    nulls = [F.lit(None).alias(column) for column in key]
    buffered = buffer.select(*key, "ts_ms", F.lit(True).alias("was_buffered")).unionByName(
        arrived.select(*key, "ts_ms", F.lit(False).alias("was_buffered"))
    )
    buffered = buffered.groupBy(*key, "ts_ms").agg(F.max("was_buffered").alias("was_buffered"))
    due = F.col("ts_ms") <= F.lit(clock.watermark)

    def buffer_change(rows: DataFrame, action: str) -> DataFrame:
        return rows.select(
            *key,
            F.lit(BUFFERED).alias("kind"),
            "ts_ms",
            F.lit(None).cast("string").alias("status"),
            F.lit(action).alias("action"),
            F.lit(None).cast("long").alias("version"),
        )

    clock_row = local_rows(spark, [(clock.watermark, clock.version)], "ts_ms long, version long").select(
        *nulls,
        F.lit(CLOCK).alias("kind"),
        "ts_ms",
        F.lit(None).cast("string").alias("status"),
        F.lit("upsert").alias("action"),
        "version",
    )
    return (
        last_changes(key, new_last)
        .unionByName(buffer_change(buffered.where(due & F.col("was_buffered")), "delete"))
        .unionByName(buffer_change(buffered.where(~due & ~F.col("was_buffered")), "insert"))
        .unionByName(clock_row)
    )


# The labels of the state table's commits: a detector batch's, and a re-derivation's.
BATCH_LABEL = "tidemark-offline-state:batch:"
REDERIVATION_LABEL = "tidemark-offline-state:rederivation:"


def same_state_row(key: Sequence[str]) -> Column:
    """Whether a state change (``s``) is about a state row (``t``): the same key and
    kind, and for a buffered track the same track."""
    return (
        null_safe_match(key)
        & (F.col("t.kind") == F.col("s.kind"))
        & ((F.col("t.kind") != F.lit(BUFFERED)) | (F.col("t.ts_ms") == F.col("s.ts_ms")))
    )


def merge_state(
    spark: SparkSession,
    state: TableRef,
    key: Sequence[str],
    changes: DataFrame,
    txn: tuple[str, int] | None,
    now: datetime,
    read_version: int,
) -> bool:
    """Apply ``changes`` (:func:`~spark_jobs.transforms.offline.changed_state`),
    computed from the state read at ``read_version``, to the state table, in one
    commit that rewrites it (no MERGE: a MERGE rebuilds the table's state from the
    log on every batch, and that state grows with every rewrite). True when the
    changes were computed from a stale state and the caller must re-derive: a
    detector batch (``txn`` given) is stale after any other commit in between (the detector's or a merge's
    re-derivation rewrote rows it read); a re-derivation (no ``txn``) only after a
    detector batch's, which moved the clock. Two re-derivations at one clock compute
    the same rows for the keys they share, so they never make each other start over:
    when they did, a merge's and the live detector's re-derivations restarted each
    other until the merge gave up."""
    same_row = same_state_row(key)
    label = f"{REDERIVATION_LABEL if txn is None else BATCH_LABEL}{uuid.uuid4().hex}"
    moment = F.lit(now).cast("timestamp")

    def merge() -> None:
        # One file: the state is a row per key and the tracks the watermark has not passed.
        def changed(current: DataFrame) -> DataFrame:
            return changed_state(current, changes, same_row, moment).coalesce(1)

        rewrite_within(spark, state.path, None, changed, label, txn)

    retry_on_conflict(merge, "offline state rewrite")
    harmless = REDERIVATION_LABEL if txn is None else None
    return committed_after_others(spark, state.path, read_version, label, harmless)


def committed_after_others(
    spark: SparkSession, path: str, read_version: int, label: str, harmless: str | None = None
) -> bool:
    """Whether someone else committed between the read at ``read_version`` and the
    commit labelled ``label``, leaving aside commits whose label starts with
    ``harmless``. No such commit (Delta skipped a replayed txn) is not late."""
    latest = table_version(spark, path)
    others = False
    for commit in commits(spark, path, read_version + 1, latest):
        if commit.user_metadata == label:
            return others
        others = others or not (harmless and (commit.user_metadata or "").startswith(harmless))
    return False


def advance_detector(
    spark: SparkSession,
    registry: TableRegistry,
    state: StateRead,
    arrived: DataFrame,
    steps: Steps,
    txn: tuple[str, int],
    now: datetime,
    append_events: Callable[[DataFrame], object],
) -> int:
    """Buffer ``arrived`` tracks, handle everything the watermark passed, write the
    status events (through ``append_events``, once per batch) and the new state
    (idempotent under ``txn``); returns how many events were emitted.

    A late merge may re-derive keys while this runs. When its state commit came
    between this batch's read and its state commit, the keys this batch handled were
    judged against stale ``last`` rows, so they are re-derived again here."""
    offline = registry.config.offline
    assert offline is not None
    key = offline.key
    _, state_table, _ = offline_tables(registry)
    watermark = steps.after.watermark
    buffer = state.rows.where(F.col("kind") == BUFFERED).select(*key, "ts_ms")
    due = buffer.unionByName(arrived).where(F.col("ts_ms") <= F.lit(watermark))
    last = last_rows(state.rows, key)
    events, new_last = transitions(last, due, key, offline.timeout_ms, watermark)
    rows = event_rows(events, key, steps.watermarks, now).persist()
    try:
        emitted = rows.count()
        if emitted:
            append_events(rows)
            crash_point("offline:events")
    finally:
        rows.unpersist()
    changes = state_changes(key, new_last, buffer, arrived, steps.after, spark)
    if merge_state(spark, state_table, key, changes, (f"{txn[0]}:state", txn[1]), now, state.version):
        touched = new_last.select(*key).unionByName(events.select(*key))
        stale_keys = touched.unionByName(rewritten_keys(spark, state_table, key, state))
        # Only another detector's batch makes a re-derivation stale, and each pipeline has one.
        if rederive_keys(spark, registry, stale_keys, now) is None:
            raise RuntimeError("another offline detector committed beside this one: run one per pipeline")
    crash_point("offline:state")
    return emitted


def rewritten_keys(spark: SparkSession, state: TableRef, key: Sequence[str], read: StateRead) -> DataFrame:
    """The keys whose last row differs between ``read`` and the table now. A batch
    whose state commit came after another writer's judged these keys against rows that writer
    replaced: a merge's re-derivation can bring a key the batch read as offline back
    online, and the batch, having emitted nothing for it, would not re-derive it."""
    before, after = last_rows(read.rows, key), last_rows(spark.read.format("delta").load(state.path), key)
    return after.exceptAll(before).unionByName(before.exceptAll(after)).select(*key)


def pending_late_tracks(spark: SparkSession, registry: TableRegistry, in_range: str) -> DataFrame:
    """The pending late tracks where ``in_range`` (SQL) holds."""
    _, _, late_table = offline_tables(registry)
    late = spark.read.format("delta").load(late_table.path)
    return late.where(F.col("status") == claims.PENDING).where(in_range)


def handled_tracks(
    spark: SparkSession, registry: TableRegistry, keys: DataFrame, clock: DetectorClock
) -> DataFrame:
    """Every bronze track of ``keys`` the detector has taken in and the watermark
    has passed, late or not: what a batch computation at ``clock`` handles."""
    offline = registry.config.offline
    assert offline is not None
    return (
        change_feed(spark.read, registry.bronze.path, last=clock.version)
        .where((F.col("_change_type") == "insert") & ~is_marker(registry.config))
        .join(F.broadcast(keys), list(offline.key), "left_semi")
        .select(*offline.key, record_millis(registry.config).alias("ts_ms"))
        .where(F.col("ts_ms") <= F.lit(clock.watermark))
    )


def rederive_keys(spark: SparkSession, registry: TableRegistry, keys: DataFrame, now: datetime) -> int | None:
    """Recompute the status history and state of ``keys`` from all their handled
    tracks, late ones included: after this, their status events equal a batch
    computation. Idempotent (a recomputation), so a killed merge simply reruns it.
    Events that stay keep the watermark they were detected at; new ones get the
    detector's current watermark. Returns how many keys it re-derived, or None when
    a detector batch committed between this read of the state and this commit: the
    recomputation used a stale clock, and the caller tries again or leaves the keys
    to the detector's stream."""
    offline = registry.config.offline
    assert offline is not None
    key = offline.key
    events_table, state_table, _ = offline_tables(registry)
    keys = keys.select(*key).distinct().persist()
    try:
        affected = keys.count()
        if not affected:
            return 0
        state = read_state(spark, state_table)
        clock = detector_clock(state.rows)
        if clock.version < 0:
            return 0
        no_last = state.rows.where(F.lit(False)).select(*key, "ts_ms", "status")
        events, new_last = transitions(
            no_last,
            handled_tracks(spark, registry, keys, clock),
            key,
            offline.timeout_ms,
            clock.watermark,
        )
        fresh = event_rows(events, key, [clock.watermark], now)
        replace_events(spark, events_table, key, keys, fresh)
        if merge_state(spark, state_table, key, last_changes(key, new_last), None, now, state.version):
            return None
        return affected
    finally:
        keys.unpersist()


def fold_claimed_tracks(
    spark: SparkSession,
    registry: TableRegistry,
    now: datetime,
    label: str,
    rederived: Callable[[], None],
) -> tuple[int, int] | None:
    """Re-derive the keys of every claimed pending late track (:mod:`~spark_jobs.engine.claims`),
    call ``rederived`` (the caller's crash point), then mark those tracks merged
    with a commit labelled ``label``. Returns (tracks, keys), or None when a detector
    batch committed beside the re-derivation and nothing was marked."""
    _, _, late_table = offline_tables(registry)
    claimed = spark.read.format("delta").load(late_table.path).where(claims.CLAIMED).persist()
    try:
        runs = sorted(row.merge_run_id for row in claimed.select("merge_run_id").distinct().collect())
        if not runs:
            return 0, 0
        tracks = claimed.count()
        keys = rederive_keys(spark, registry, claimed, now)
        if keys is None:
            return None
        rederived()
        # The runs read above, not any claimed row: a claim made since was not re-derived.
        claims.mark_merged(spark, late_table.path, claims.claimed_by(*runs), now, label)
        return tracks, keys
    finally:
        claimed.unpersist()


def replace_events(
    spark: SparkSession, events_table: TableRef, key: Sequence[str], keys: DataFrame, fresh: DataFrame
) -> None:
    """Make ``keys``' rows of the status events exactly ``fresh``, each event once:
    an event that stays keeps the watermark and moment it was first detected at,
    new ones are inserted, and the rest go, copies of an event included.

    Not a MERGE: every copy of an event matches the one fresh row, so a MERGE keeps
    them all. Copies arise when a detector batch read ``last`` rows that a stale
    re-derivation had just rewritten (its retry puts the state right, the batch's
    append lands anyway); the detector then re-derives those keys here."""
    # SQL text, parsed once: a Column built per key costs a JVM call per operator,
    # and its depth overflows the JVM's stack.
    of_keys = " OR ".join(
        "(" + " AND ".join(f"{quote_identifier(c)} <=> {sql_literal(row[c])}" for c in key) + ")"
        for row in keys.collect()
    )
    if not of_keys:
        return
    event = [*key, "status", "event_time"]
    first = F.min(F.struct("watermark", "detected_at")).alias("first")

    def replace() -> None:
        current = spark.read.format("delta").load(events_table.path).where(of_keys)
        detected = current.groupBy(*event).agg(first)
        rows = fresh.alias("s").join(detected.alias("t"), null_safe_match(event), "left")
        (
            rows.select(
                *(column_of("s", c) for c in event),
                F.coalesce(F.col("t.first.watermark"), F.col("s.watermark")).alias("watermark"),
                F.coalesce(F.col("t.first.detected_at"), F.col("s.detected_at")).alias("detected_at"),
            )
            .write.format("delta")
            .mode("overwrite")
            .option("replaceWhere", of_keys)
            .save(events_table.path)
        )

    retry_on_conflict(replace, "status events replace")


def sql_literal(value: object) -> str:
    """A key value as Spark SQL literal text."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):  # repr gives nan and inf, which SQL would read as names
        return f"CAST({string_literal(repr(value))} AS DOUBLE)"
    return string_literal(str(value))
