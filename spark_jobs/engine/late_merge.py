"""The late merge: quarantine (pending) -> silver windows (revision + 1,
``late_merged_count``) -> gold for the affected keys -> quarantine rows marked
merged, and the run in ``ops.runs``.

Beside the live streams it always finishes, because it never competes with a
stream for what the stream writes (DESIGN §4):

- the claim marks the unclaimed pending rows with the run's id, rewriting only the
  pending files it read: silver's quarantine appends land beside it, never on it;
- the silver write rewrites only the closed windows the claimed rows fall in. A
  window is closed by the very silver commit that sends its first late pair to the
  quarantine (windows are written before the quarantine), and silver's stream reads
  and rewrites only open and fired windows;
- gold belongs to the gold stream, which follows silver's change feed: the merge
  refreshes the keys it changed itself, unless the gold stream commits beside it,
  which then refreshes them from the merge's silver commit;
- offline detection's state belongs to its stream: the merge re-derives the keys of
  the late tracks it claimed unless a detector batch commits beside it, and then
  leaves the claim to the stream, which folds claimed tracks in with its next batch.

Idempotent and crash-safe: the claim's Delta version is the run's txn version, so
the silver write carries (txnAppId ``merge-late:<p>``, claim version) and Delta
skips it if it already committed. Gold is recomputed from silver, then the claimed
rows are marked merged. A run killed anywhere is finished by the next run, which
first looks for claimed rows still pending; re-running a finished merge finds
nothing pending and writes nothing but its ``ops.runs`` row. Every write gives up
after a bounded number of conflicts, naming the writers it lost to, and Airflow's
retry finishes the claim.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.config import ConfigError
from spark_jobs.engine import claims, detector
from spark_jobs.engine.clocks import load_clock
from spark_jobs.engine.gold_store import changed_keys, refresh_gold
from spark_jobs.engine.session_store import fold_late_sessions, gold_keys_of_sessions, late_keys
from spark_jobs.engine.window_store import with_late_partials
from spark_jobs.eventtime.windows import SessionSpec
from spark_jobs.faults import crash_point
from spark_jobs.lakehouse.create import create_missing
from spark_jobs.lakehouse.log import commits, table_version
from spark_jobs.lakehouse.runs import RunLog, RunTotals
from spark_jobs.lakehouse.transaction import ConflictsExhausted, Rewrite, retry_on_conflict, rewrite_files
from spark_jobs.sql import timestamp_literal
from spark_jobs.tables import TableRegistry
from spark_jobs.transforms.aggregates import partial_aggregates
from spark_jobs.transforms.windows import CLOSED

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Commits read from the quarantine's log per request when looking for a claim.
CLAIM_LOOKBACK = 64
# How long a merge waits for the offline stream to fold in the late tracks it left
# to it, and how often it looks.
HANDOVER_WAIT_S = 60.0
HANDOVER_POLL_S = 1.0
# Re-derivations of late tracks' keys a merge tries before it gives up.
REDERIVE_ATTEMPTS = 3


@dataclass(frozen=True)
class TimeRange:
    """Merge only quarantine rows whose window starts in ``[start, end)``."""

    start: datetime | None = None
    end: datetime | None = None

    def sql(self, column: str = "window_start") -> str:
        """SQL: ``column`` in the range (literals, so file statistics prune by it)."""
        conditions = []
        if self.start is not None:
            conditions.append(f"{column} >= {timestamp_literal(self.start)}")
        if self.end is not None:
            conditions.append(f"{column} < {timestamp_literal(self.end)}")
        return " AND ".join(conditions) or "TRUE"

    @classmethod
    def parsed(cls, start: str | None, end: str | None) -> TimeRange:
        """The range between two ISO-8601 instants (``--from``, ``--to``), checked."""
        window = cls(parse_moment(start, "--from"), parse_moment(end, "--to"))
        if window.start and window.end and window.start >= window.end:
            raise ConfigError("--to", f"must be after --from ({start}); got {end}")
        return window

    def describe(self) -> str:
        if self.start is None and self.end is None:
            return "all windows"
        return f"windows starting in [{self.start or '-inf'}, {self.end or '+inf'})"


@dataclass
class MergeReport:
    records: int = 0
    windows: int = 0
    # What ``windows`` counts: silver's windows, or the keys whose sessions were folded.
    extents: str = "windows"
    new_windows: int = 0
    gold_keys: int = 0
    gold_handed_over: bool = False
    late_tracks: int = 0
    status_keys: int = 0
    tracks_handed_over: bool = False

    def add(self, other: MergeReport) -> None:
        self.records += other.records
        self.windows += other.windows
        self.new_windows += other.new_windows
        self.gold_keys += other.gold_keys
        self.gold_handed_over |= other.gold_handed_over
        self.late_tracks += other.late_tracks
        self.status_keys += other.status_keys
        self.tracks_handed_over |= other.tracks_handed_over


def parse_moment(value: str | None, field: str) -> datetime | None:
    """An ISO-8601 instant; without a zone it is UTC."""
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        example = "2026-01-01T10:00:00Z"
        raise ConfigError(field, f"expected an ISO-8601 time such as {example}; got {value!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def quarantine(spark: SparkSession, registry: TableRegistry) -> DataFrame:
    return spark.read.format("delta").load(registry.quarantine.path)


def late_partials(late: DataFrame, registry: TableRegistry) -> DataFrame:
    """Quarantined (record, window) rows -> mergeable partials per (window, key)."""
    config = registry.config
    return late.groupBy("window_start", "window_end", *config.key).agg(*partial_aggregates(config))


def step_label(run_id: str, step: str) -> str:
    """The label of a merge run's commit for ``step``: what its log and a losing writer's error name."""
    return f"tidemark-merge-late:{run_id}:{step}"


def closed_windows_starting(starts: list[datetime]) -> str:
    """SQL: a closed silver window starting at one of ``starts`` (an equality each, so
    that file statistics prune by every start, not by their overall range)."""
    return (
        f"status = '{CLOSED}' AND ("
        + " OR ".join(f"window_start = {timestamp_literal(start)}" for start in starts)
        + ")"
    )


def claim(spark: SparkSession, registry: TableRegistry, run_id: str, window: TimeRange) -> int | None:
    """Mark the unclaimed pending rows in ``window`` as this run's; returns the
    claim's Delta version, or None when there was nothing to claim."""
    claimed = claims.claim(spark, registry.quarantine.path, run_id, window.sql())
    return None if claimed is None else claimed.version


def claim_version(spark: SparkSession, registry: TableRegistry, run_id: str) -> int | None:
    """The quarantine version whose commit carries ``run_id`` (its claim), looked for
    from the newest commit back, on the driver (the table's history is a Spark job)."""
    path = registry.quarantine.path
    for end in range(table_version(spark, path), -1, -CLAIM_LOOKBACK):
        chunk = commits(spark, path, max(0, end - CLAIM_LOOKBACK + 1), end)
        labelled = [commit.version for commit in chunk if commit.user_metadata == claims.CLAIM_LABEL + run_id]
        if labelled:
            return labelled[-1]
    return None


@dataclass(frozen=True)
class Claims:
    """The pending rows' claims: runs stopped before marking the rows they claimed
    merged, and whether unclaimed rows wait in the window."""

    unfinished_runs: list[str]
    any_unclaimed: bool


def pending_claims(spark: SparkSession, registry: TableRegistry, window: TimeRange) -> Claims:
    """One read of the pending rows for both questions a run asks before it claims."""
    claimable = F.expr(claims.unclaimed(window.sql())).alias("claimable")
    rows = (
        quarantine(spark, registry)
        .where(F.col("status") == claims.PENDING)
        .select("merge_run_id", claimable)
        .distinct()
        .collect()
    )
    return Claims(
        sorted(row.merge_run_id for row in rows if row.merge_run_id is not None),
        any(row.claimable for row in rows),
    )


def merge_silver(
    spark: SparkSession,
    registry: TableRegistry,
    partials: DataFrame,
    starts: list[datetime],
    txn: tuple[str, int],
    now: datetime,
    label: str,
) -> Rewrite | None:
    """Fold the partials into their closed silver windows (:func:`with_late_partials`),
    rewriting only the closed files that hold those windows, in a commit labelled
    ``label``; None when the transaction id shows a run before it committed this.
    The windows it created are the rows it wrote beyond those it replaced."""
    config = registry.config
    path = registry.silver.path

    def write() -> Rewrite | None:
        return rewrite_files(
            spark,
            path,
            closed_windows_starting(starts),
            lambda closed: with_late_partials(closed, partials, config, now),
            label,
            txn,
        )

    return retry_on_conflict(write, "silver write of late records", (spark, path))


@dataclass
class MergePlan:
    """What merging some quarantine rows changes: partials per (window, key), the
    windows' starts, and the figures a dry run prints."""

    partials: DataFrame
    starts: list[datetime]
    gold_keys: list
    report: MergeReport


def plan_merge(spark: SparkSession, registry: TableRegistry, late: DataFrame) -> MergePlan:
    partials = late_partials(late, registry).persist()
    # Collected as epoch micros: collecting the timestamps would give naive local wall times.
    per_start = (
        partials.groupBy(F.unix_micros("window_start").alias("micros"))
        .agg(F.count(F.lit(1)).alias("windows"), F.sum("record_count").alias("records"))
        .collect()
    )
    starts = sorted(EPOCH + timedelta(microseconds=row.micros) for row in per_start)
    keys = changed_keys(partials, registry) if registry.gold is not None and starts else []
    report = MergeReport(
        sum(row.records for row in per_start), sum(row.windows for row in per_start), gold_keys=len(keys)
    )
    return MergePlan(partials, starts, keys, report)


def new_windows(spark: SparkSession, registry: TableRegistry, plan: MergePlan) -> int:
    """The planned windows silver does not hold yet."""
    window_key = ["window_start", "window_end", *registry.config.key]
    existing = (
        spark.read.format("delta").load(registry.silver.path).where(F.col("window_start").isin(plan.starts))
    )
    return plan.partials.select(*window_key).join(existing, window_key, "left_anti").count()


class Progress:
    """A merge's steps in its log, each with the seconds since the run started: where a
    slow merge spent its time, for whoever reads the task's log."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def done(self, step: str) -> None:
        print(f"tidemark merge-late: {step} at {time.monotonic() - self.started:.1f} s", file=sys.stderr)


def finish(
    spark: SparkSession, registry: TableRegistry, run_id: str, version: int, progress: Progress
) -> MergeReport:
    """Merge the rows ``run_id`` claimed (at quarantine ``version``) and mark them merged."""
    now = datetime.now(UTC)
    claimed = quarantine(spark, registry).where(claims.claimed_by(run_id))
    txn = (f"merge-late:{registry.config.name}", version)
    if isinstance(registry.config.window, SessionSpec):
        report = fold_sessions(spark, registry, claimed, txn, now, run_id)
        progress.done(f"{report.records} records folded into sessions, gold refreshed or handed over")
    else:
        report = merge_windows(spark, registry, claimed, txn, now, run_id, progress)
    claims.mark_merged(
        spark, registry.quarantine.path, claims.claimed_by(run_id), now, step_label(run_id, "mark")
    )
    crash_point("merge_late:mark")
    progress.done("quarantine rows marked merged")
    return report


def fold_sessions(
    spark: SparkSession,
    registry: TableRegistry,
    claimed: DataFrame,
    txn: tuple[str, int],
    now: datetime,
    run_id: str,
) -> MergeReport:
    """Fold the claimed records into their keys' sessions, settled at silver's
    watermark, then refresh the gold keys those sessions counted in before and after."""
    watermark = load_clock(spark, registry).tracker.watermark
    keys = late_keys(claimed, registry.config)
    report = MergeReport(claimed.count(), len(keys), extents="keys' sessions")
    before = gold_keys_of_sessions(spark, registry, keys)
    written = fold_late_sessions(
        spark, registry, claimed, keys, watermark, txn, step_label(run_id, "silver"), now
    )
    if written is not None:
        report.new_windows = written.rows_written - written.rows_replaced
    crash_point("merge_late:silver")
    # A rerun after a crash here finds the sessions folded already, and so the grains
    # they count in now only: any they left are refreshed by the gold stream, which
    # reads the fold's commit from silver's change feed.
    gold_keys = {tuple(key): key for key in [*before, *gold_keys_of_sessions(spark, registry, keys)]}
    report.gold_keys = len(gold_keys)
    if gold_keys:
        refreshed = refresh_gold(
            spark, registry, list(gold_keys.values()), now, step_label(run_id, "gold"), owner="gold"
        )
        report.gold_handed_over = refreshed is None
    crash_point("merge_late:gold")
    return report


def merge_windows(
    spark: SparkSession,
    registry: TableRegistry,
    claimed: DataFrame,
    txn: tuple[str, int],
    now: datetime,
    run_id: str,
    progress: Progress,
) -> MergeReport:
    """Fold the claimed pairs into their closed windows, then refresh gold."""
    plan = plan_merge(spark, registry, claimed)
    progress.done(f"planned {plan.report.records} records into {plan.report.windows} windows")
    try:
        if plan.starts:
            written = merge_silver(
                spark, registry, plan.partials, plan.starts, txn, now, step_label(run_id, "silver")
            )
            if written is not None:
                plan.report.new_windows = written.rows_written - written.rows_replaced
    finally:
        plan.partials.unpersist()
    crash_point("merge_late:silver")
    progress.done("silver written")
    if plan.gold_keys:
        refreshed = refresh_gold(
            spark, registry, plan.gold_keys, now, step_label(run_id, "gold"), owner="gold"
        )
        plan.report.gold_handed_over = refreshed is None
    crash_point("merge_late:gold")
    progress.done("gold refreshed or handed over")
    return plan.report


def merge_late(
    spark: SparkSession,
    registry: TableRegistry,
    window: TimeRange,
    offline_busy: Callable[[], bool] | None = None,
) -> MergeReport:
    """Finish every interrupted run, then claim and merge the pending rows in ``window``.
    The late tracks are claimed first, so that a live offline stream folds them in
    while the merge writes silver; ``offline_busy`` tells of that stream when it runs
    beside the merge (:func:`fold_late_tracks`)."""
    progress = Progress()
    create_missing(spark, registry)
    total = MergeReport()
    pending = pending_claims(spark, registry, window)
    progress.done("pending rows read")
    for run_id in pending.unfinished_runs:
        version = claim_version(spark, registry, run_id)
        if version is None:
            raise RuntimeError(
                f"quarantine rows claimed by merge run {run_id} but its claim commit is no longer "
                "in the Delta history; set their merge_run_id to NULL to merge them again"
            )
        print(f"tidemark merge-late: finishing interrupted run {run_id}", file=sys.stderr)
        total.add(finish(spark, registry, run_id, version, progress))
    run_id = uuid.uuid4().hex
    version = claim(spark, registry, run_id, window) if pending.any_unclaimed else None
    crash_point("merge_late:claim")
    progress.done("records claimed")
    tracks = claim_late_tracks(spark, registry, window, run_id) if registry.config.offline else 0
    progress.done(f"{tracks} late tracks claimed")
    if version is not None:
        total.add(finish(spark, registry, run_id, version, progress))
    if registry.config.offline is not None:
        total.add(fold_late_tracks(spark, registry, run_id, tracks, offline_busy))
        progress.done("late tracks folded in")
    return total


def claim_late_tracks(spark: SparkSession, registry: TableRegistry, window: TimeRange, run_id: str) -> int:
    """Claim the pending late tracks whose time is in ``window``; returns how many."""
    _, _, late_table = detector.offline_tables(registry)
    claimed = claims.claim(spark, late_table.path, run_id, window.sql("event_time"))
    crash_point("merge_late:claim_tracks")
    if claimed is None:
        return 0
    return spark.read.format("delta").load(late_table.path).where(claims.of_run(run_id)).count()


def fold_late_tracks(
    spark: SparkSession,
    registry: TableRegistry,
    run_id: str,
    claimed: int,
    offline_busy: Callable[[], bool] | None,
) -> MergeReport:
    """Re-derive the status history of the keys of every claimed late track (an
    interrupted run's too: a re-derivation is a recomputation), then mark those
    tracks merged; ``claimed`` of them are this run's.

    The detector's state is its stream's. A live offline stream sees the claim and
    folds the claimed tracks in with its next batch, often while the merge writes
    silver: then nothing is left to do here. A merge that sees the stream
    (``offline_busy``: the application it runs in runs it) waits for that first while
    the stream has input or a batch at work; a quiet stream runs no batch, so the merge
    re-derives at once. A re-derivation here that finds a detector batch committed
    beside it leaves the claim to the stream and waits as well, within
    :data:`HANDOVER_WAIT_S` each time, then tries again: :data:`REDERIVE_ATTEMPTS`."""
    _, _, late_table = detector.offline_tables(registry)
    if claimed and offline_busy is not None:
        if folded_in(spark, late_table.path, run_id, HANDOVER_WAIT_S, offline_busy):
            return MergeReport(tracks_handed_over=True)
        print(
            "tidemark merge-late: the offline stream has no input to fold the claimed late tracks in "
            "with; re-deriving them here",
            file=sys.stderr,
        )
    started = time.monotonic()
    for _ in range(REDERIVE_ATTEMPTS):
        now = datetime.now(UTC)
        folded = detector.fold_claimed_tracks(
            spark, registry, now, step_label(run_id, "mark"), lambda: crash_point("merge_late:rederive")
        )
        if folded is not None:
            tracks, keys = folded
            # Nothing claimed was left: the offline stream had folded this run's tracks in.
            return MergeReport(late_tracks=tracks, status_keys=keys, tracks_handed_over=claimed > tracks)
        print(
            "tidemark merge-late: a detector batch committed beside the re-derivation; the offline "
            f"stream folds the claimed late tracks in (waiting up to {HANDOVER_WAIT_S:.0f} s)",
            file=sys.stderr,
        )
        if folded_in(spark, late_table.path, run_id, HANDOVER_WAIT_S, offline_busy or always_busy):
            return MergeReport(tracks_handed_over=True)
    raise ConflictsExhausted(
        f"late tracks: detector batches committed beside {REDERIVE_ATTEMPTS} re-derivations in "
        f"{time.monotonic() - started:.0f} s and the offline stream did not fold the claimed tracks "
        "in meanwhile; run the merge again"
    )


def always_busy() -> bool:
    """For a stream the merge cannot see: it may run a batch at any moment."""
    return True


def folded_in(
    spark: SparkSession, path: str, run_id: str, within_s: float, stream_busy: Callable[[], bool]
) -> bool:
    """Whether no late track ``run_id`` claimed is pending any longer, within ``within_s``
    and while the stream that folds them is busy (a quiet one runs no batch to fold with)."""
    deadline = time.monotonic() + within_s
    while True:
        if spark.read.format("delta").load(path).where(claims.claimed_by(run_id)).isEmpty():
            return True
        if time.monotonic() >= deadline or not stream_busy():
            return False
        time.sleep(HANDOVER_POLL_S)


def dry_run(spark: SparkSession, registry: TableRegistry, window: TimeRange) -> MergeReport:
    """Print what a merge would change; write nothing."""
    late = quarantine(spark, registry).where(F.col("status") == claims.PENDING).where(window.sql())
    print(f"dry run: merge-late of pipeline {registry.config.name!r}, {window.describe()}")
    if isinstance(registry.config.window, SessionSpec):
        keys = late_keys(late, registry.config)
        report = MergeReport(late.count(), len(keys), extents="keys' sessions")
        report.gold_keys = len(gold_keys_of_sessions(spark, registry, keys))
        print(f"  pending late records: {report.records}")
        print(f"  keys whose sessions they extend, bridge or start: {report.windows}")
        print(f"  gold keys to recompute (as the sessions stand): {report.gold_keys}")
        return report
    plan = plan_merge(spark, registry, late)
    try:
        report = plan.report
        report.new_windows = new_windows(spark, registry, plan)
        print(f"  pending late records: {report.records}")
        print(
            f"  silver windows: {report.windows} "
            f"({report.windows - report.new_windows} get revision + 1, {report.new_windows} new)"
        )
        print(f"  gold keys to recompute: {report.gold_keys}")
        if registry.config.offline is not None:
            late_tracks = detector.pending_late_tracks(spark, registry, window.sql("event_time"))
            keys = late_tracks.select(*registry.config.offline.key).distinct().count()
            print(f"  late tracks: {late_tracks.count()} (status history re-derived for {keys} keys)")
        if report.windows:
            plan.partials.select("window_start", "window_end", *registry.config.key, "record_count").orderBy(
                "window_start", *registry.config.key
            ).show(20, truncate=False)
    finally:
        plan.partials.unpersist()
    return report


def summary(report: MergeReport) -> str:
    """What a merge did, for its log and ``ops.runs``."""
    gold = (
        f"{report.gold_keys} gold keys left to the gold stream"
        if report.gold_handed_over
        else f"{report.gold_keys} gold keys recomputed"
    )
    tracks = f"{report.late_tracks} late tracks, status history re-derived for {report.status_keys} keys"
    if report.tracks_handed_over:
        tracks += " (the offline stream folded in this run's)"
    return (
        f"merged {report.records} late records into {report.windows} {report.extents} "
        f"({report.new_windows} new); {gold}; {tracks}"
    )


def logged_merge(
    spark: SparkSession,
    registry: TableRegistry,
    window: TimeRange,
    offline_busy: Callable[[], bool] | None = None,
) -> str:
    """:func:`merge_late` as a run in ``ops.runs``; returns what it did (:func:`summary`)."""
    log = RunLog(spark, "merge_late", registry)
    log.started()
    try:
        report = merge_late(spark, registry, window, offline_busy)
    except Exception as error:
        log.ended("failed", RunTotals(), str(error)[:2000])
        raise
    message = summary(report)
    totals = RunTotals(batches=1, rows_in=report.records, rows_out=report.windows, late=report.records)
    log.ended("succeeded", totals, message)
    return message
