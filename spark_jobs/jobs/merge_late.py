"""Late merge: quarantine (pending) -> silver windows (revision + 1,
``late_merged_count``) -> gold for the affected keys -> quarantine rows marked
merged, and the run in ``ops.runs``.

Idempotent and crash-safe. A run first *claims* the pending rows it will merge:
one UPDATE sets their ``merge_run_id`` and its commit carries the run id as
user metadata, so the claim's Delta version can be found again. That version is
the run's txn version: the silver MERGE carries (txnAppId ``merge-late:<p>``,
claim version), so Delta skips it if it already committed. Gold is recomputed
from silver (idempotent by construction), then the claimed rows are marked
merged. A run killed anywhere is finished by the next run, which first looks
for claimed rows still pending; re-running a finished merge finds nothing
pending and writes nothing but its ``ops.runs`` row.

Safe beside the streams: silver's quarantine appends are blind appends, which
never conflict with the claim and mark UPDATEs; conflicting MERGEs are retried
from a fresh snapshot. Cheap: pending rows are read from their own partition,
and the silver and gold MERGEs are pruned to the windows and grains the late
records fall in, so the cost follows the late records, not the table sizes.
"""

from __future__ import annotations

import argparse
import operator
import os
import sys
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import reduce

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.arguments import with_examples
from spark_jobs.config import PIPELINE_HELP, ConfigError, load_pipeline
from spark_jobs.engine import detector
from spark_jobs.engine.gold_store import changed_keys, refresh_gold
from spark_jobs.jobs.common import (
    USER_METADATA,
    RunLog,
    RunTotals,
    crash_point,
    delta_txn,
    exit_on_config_error,
    folder_argument,
    retry_on_conflict,
    session_settings,
)
from spark_jobs.session import build_session
from spark_jobs.sql import column_of, null_safe_match
from spark_jobs.tables import TableRegistry, commits, join, table_version
from spark_jobs.transforms.aggregates import finished_measures, merged_measures, partial_aggregates
from spark_jobs.transforms.windows import CLOSED

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# A claim's commit is looked for among the quarantine's latest commits first (silver's
# appends may land between the claim and the look), then in the whole history.
CLAIM_SEARCH_COMMITS = 50


@dataclass(frozen=True)
class TimeRange:
    """Merge only quarantine rows whose window starts in ``[start, end)``."""

    start: datetime | None = None
    end: datetime | None = None

    def condition(self, column: str = "window_start") -> Column:
        conditions = [F.lit(True)]
        if self.start is not None:
            conditions.append(F.col(column) >= F.lit(self.start))
        if self.end is not None:
            conditions.append(F.col(column) < F.lit(self.end))
        return reduce(operator.and_, conditions)

    def describe(self) -> str:
        if self.start is None and self.end is None:
            return "all windows"
        return f"windows starting in [{self.start or '-inf'}, {self.end or '+inf'})"


@dataclass
class MergeReport:
    records: int = 0
    windows: int = 0
    new_windows: int = 0
    gold_keys: int = 0
    late_tracks: int = 0
    status_keys: int = 0

    def add(self, other: MergeReport) -> None:
        self.records += other.records
        self.windows += other.windows
        self.new_windows += other.new_windows
        self.gold_keys += other.gold_keys
        self.late_tracks += other.late_tracks
        self.status_keys += other.status_keys


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


def pending(spark: SparkSession, registry: TableRegistry) -> DataFrame:
    return quarantine(spark, registry).where(F.col("status") == "pending")


def late_partials(late: DataFrame, registry: TableRegistry) -> DataFrame:
    """Quarantined (record, window) rows -> mergeable partials per (window, key)."""
    config = registry.config
    return late.groupBy("window_start", "window_end", *config.key).agg(*partial_aggregates(config))


def window_match(registry: TableRegistry, starts: list[datetime]) -> Column:
    """The MERGE condition: same window and key, pruned to ``starts`` (literals,
    so Delta skips the files whose window_start range holds none of them)."""
    return F.col("t.window_start").isin(starts) & null_safe_match(
        ("window_start", "window_end", *registry.config.key)
    )


def unclaimed(window: TimeRange) -> Column:
    """Pending quarantine rows in ``window`` that no merge run has claimed."""
    return (F.col("status") == "pending") & F.col("merge_run_id").isNull() & window.condition()


def claim(spark: SparkSession, registry: TableRegistry, run_id: str, window: TimeRange) -> int | None:
    """Mark the unclaimed pending rows in ``window`` as this run's; returns the
    claim's Delta version, or None when there was nothing to claim."""

    def update() -> None:
        with session_settings(spark, {USER_METADATA: run_id}):
            DeltaTable.forPath(spark, registry.quarantine.path).update(
                unclaimed(window), {"merge_run_id": F.lit(run_id)}
            )

    retry_on_conflict(update, "quarantine claim")
    recent = claim_version(spark, registry, run_id, CLAIM_SEARCH_COMMITS)
    return recent if recent is not None else claim_version(spark, registry, run_id)


def claim_version(
    spark: SparkSession, registry: TableRegistry, run_id: str, latest: int | None = None
) -> int | None:
    """The quarantine version whose commit carries ``run_id``: among the ``latest``
    commits, or (None) the table's whole history. Read from the log on the driver:
    the table's history is a Spark job."""
    path = registry.quarantine.path
    newest = table_version(spark, path)
    oldest = 0 if latest is None else newest - latest + 1
    return next((c.version for c in commits(spark, path, oldest, newest) if c.user_metadata == run_id), None)


@dataclass(frozen=True)
class Claims:
    """The pending rows' claims: runs stopped before marking the rows they claimed
    merged, and whether unclaimed rows wait in the window."""

    unfinished_runs: list[str]
    any_unclaimed: bool


def pending_claims(spark: SparkSession, registry: TableRegistry, window: TimeRange) -> Claims:
    """One read of the pending rows for both questions a run asks before it claims."""
    claimable = unclaimed(window).alias("claimable")
    rows = pending(spark, registry).select("merge_run_id", claimable).distinct().collect()
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
) -> int:
    """MERGE the partials into silver; returns the windows it inserted (0 when the
    transaction id shows a run before it committed this MERGE)."""
    config = registry.config
    moment = F.lit(now).cast("timestamp")

    def merge() -> int:
        target = DeltaTable.forPath(spark, registry.silver.path).alias("t")
        statement = (
            target.merge(partials.alias("s"), window_match(registry, starts))
            .whenMatchedUpdate(
                set={
                    **merged_measures(config),
                    "revision": F.col("t.revision") + F.lit(1),
                    "late_merged_count": F.col("t.late_merged_count") + F.col("s.record_count"),
                    "updated_at": moment,
                }
            )
            .whenNotMatchedInsert(
                values={
                    "window_start": F.col("s.window_start"),
                    "window_end": F.col("s.window_end"),
                    **{column: column_of("s", column) for column in config.key},
                    **finished_measures(config),
                    # A window only late records fell in: past its cleanup, so closed.
                    "revision": F.lit(1),
                    "status": F.lit(CLOSED),
                    "late_merged_count": F.col("s.record_count"),
                    "updated_at": moment,
                }
            )
        )
        with delta_txn(spark, *txn):
            metrics = statement.execute().first()
        return 0 if metrics is None else metrics.num_inserted_rows

    return retry_on_conflict(merge, "silver MERGE of late records")


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
        DeltaTable.forPath(spark, registry.silver.path).toDF().where(F.col("window_start").isin(plan.starts))
    )
    return plan.partials.select(*window_key).join(existing, window_key, "left_anti").count()


def finish(spark: SparkSession, registry: TableRegistry, run_id: str, version: int) -> MergeReport:
    """Merge the rows ``run_id`` claimed (at quarantine ``version``) and mark them merged."""
    now = datetime.now(UTC)
    claimed = pending(spark, registry).where(F.col("merge_run_id") == run_id)
    plan = plan_merge(spark, registry, claimed)
    try:
        if plan.starts:
            txn = (f"merge-late:{registry.config.name}", version)
            plan.report.new_windows = merge_silver(spark, registry, plan.partials, plan.starts, txn, now)
    finally:
        plan.partials.unpersist()
    crash_point("merge_late:silver")
    refresh_gold(spark, registry, plan.gold_keys, now)
    crash_point("merge_late:gold")

    def mark() -> None:
        DeltaTable.forPath(spark, registry.quarantine.path).update(
            (F.col("status") == "pending") & (F.col("merge_run_id") == run_id),
            {"status": F.lit("merged"), "merged_at": F.lit(now).cast("timestamp")},
        )

    retry_on_conflict(mark, "quarantine mark")
    crash_point("merge_late:mark")
    return plan.report


def merge_late(spark: SparkSession, registry: TableRegistry, window: TimeRange) -> MergeReport:
    """Finish every interrupted run, then claim and merge the pending rows in ``window``."""
    registry.create_missing(spark)
    total = MergeReport()
    claims = pending_claims(spark, registry, window)
    for run_id in claims.unfinished_runs:
        version = claim_version(spark, registry, run_id)
        if version is None:
            raise RuntimeError(
                f"quarantine rows claimed by merge run {run_id} but its claim commit is no longer "
                "in the Delta history; set their merge_run_id to NULL to merge them again"
            )
        print(f"tidemark merge-late: finishing interrupted run {run_id}", file=sys.stderr)
        total.add(finish(spark, registry, run_id, version))
    run_id = uuid.uuid4().hex
    version = claim(spark, registry, run_id, window) if claims.any_unclaimed else None
    crash_point("merge_late:claim")
    if version is not None:
        total.add(finish(spark, registry, run_id, version))
    if registry.config.offline is not None:
        total.add(merge_late_tracks(spark, registry, window, run_id))
    return total


def merge_late_tracks(
    spark: SparkSession, registry: TableRegistry, window: TimeRange, run_id: str
) -> MergeReport:
    """Re-derive the status history of the keys with pending late tracks (whose
    time is in ``window``), then mark those tracks merged. The re-derivation is a
    recomputation, so a run killed before the mark is finished by running again."""
    now = datetime.now(UTC)
    late = detector.pending_late_tracks(spark, registry, window.condition("event_time")).persist()
    try:
        tracks, latest = late.agg(F.count(F.lit(1)), F.max("quarantined_at")).first()
        if not tracks:
            return MergeReport()
        keys = detector.rederive_keys(spark, registry, late, now)
        crash_point("merge_late:rederive")
        _, _, late_table = detector.offline_tables(registry)

        def mark() -> None:
            # Tracks quarantined after the read above were not re-derived: they wait.
            DeltaTable.forPath(spark, late_table.path).update(
                (F.col("status") == "pending")
                & window.condition("event_time")
                & (F.col("quarantined_at") <= F.lit(latest)),
                {
                    "status": F.lit("merged"),
                    "merged_at": F.lit(now).cast("timestamp"),
                    "merge_run_id": F.lit(run_id),
                },
            )

        retry_on_conflict(mark, "late tracks mark")
    finally:
        late.unpersist()
    return MergeReport(late_tracks=tracks, status_keys=keys)


def dry_run(spark: SparkSession, registry: TableRegistry, window: TimeRange) -> MergeReport:
    """Print what a merge would change; write nothing."""
    late = pending(spark, registry).where(window.condition())
    plan = plan_merge(spark, registry, late)
    try:
        report = plan.report
        report.new_windows = new_windows(spark, registry, plan)
        print(f"dry run: merge-late of pipeline {registry.config.name!r}, {window.describe()}")
        print(f"  pending late records: {report.records}")
        print(
            f"  silver windows: {report.windows} "
            f"({report.windows - report.new_windows} get revision + 1, {report.new_windows} new)"
        )
        print(f"  gold keys to recompute: {report.gold_keys}")
        if registry.config.offline is not None:
            late_tracks = detector.pending_late_tracks(spark, registry, window.condition("event_time"))
            keys = late_tracks.select(*registry.config.offline.key).distinct().count()
            print(f"  late tracks: {late_tracks.count()} (status history re-derived for {keys} keys)")
        if report.windows:
            plan.partials.select("window_start", "window_end", *registry.config.key, "record_count").orderBy(
                "window_start", *registry.config.key
            ).show(20, truncate=False)
    finally:
        plan.partials.unpersist()
    return report


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tidemark merge-late",
        description="Fold pending quarantined late records into their silver windows and gold.",
    )
    with_examples(
        parser,
        "tidemark merge-late --pipeline telemetry --dry-run",
        "tidemark merge-late --pipeline telemetry --from 2026-01-01 --to 2026-01-02",
    )
    parser.add_argument("--pipeline", required=True, help=PIPELINE_HELP)
    parser.add_argument("--lakehouse", help="lakehouse root (default: $LAKEHOUSE_DIR or ./lakehouse)")
    parser.add_argument("--dry-run", action="store_true", help="print what would change; write nothing")
    parser.add_argument("--from", dest="start", help="only windows starting at or after this ISO-8601 time")
    parser.add_argument("--to", dest="end", help="only windows starting before this ISO-8601 time")
    return parser


@exit_on_config_error
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    window = TimeRange(parse_moment(args.start, "--from"), parse_moment(args.end, "--to"))
    if window.start and window.end and window.start >= window.end:
        raise ConfigError("--to", f"must be after --from ({args.start}); got {args.end}")
    config = load_pipeline(args.pipeline)
    registry = TableRegistry(config, folder_argument(args.lakehouse, "--lakehouse"))
    local = "://" not in registry.root
    if local and not os.path.isdir(registry.root):
        raise ConfigError("--lakehouse", f"no lakehouse at {registry.root}")
    if local and not os.path.isdir(join(registry.quarantine.path, "_delta_log")):
        # Silver has not run yet (a scheduled merge may come first): nothing is late.
        print(f"tidemark merge-late: no quarantine table at {registry.quarantine.path} yet; nothing to merge")
        return 0
    spark = build_session(f"tidemark-merge-late-{config.name}")
    if args.dry_run:
        dry_run(spark, registry, window)
        return 0
    log = RunLog(spark, "merge_late", registry)
    log.started()
    try:
        report = merge_late(spark, registry, window)
    except Exception as error:
        log.ended("failed", RunTotals(), str(error)[:2000])
        raise
    totals = RunTotals(batches=1, rows_in=report.records, rows_out=report.windows, late=report.records)
    message = (
        f"merged {report.records} late records into {report.windows} windows "
        f"({report.new_windows} new); {report.gold_keys} gold keys recomputed; "
        f"{report.late_tracks} late tracks, status history re-derived for {report.status_keys} keys"
    )
    log.ended("succeeded", totals, message)
    print(f"tidemark merge-late: {message}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
