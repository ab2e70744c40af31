"""Silver: bronze stream -> watermark bookkeeping -> windows -> silver, quarantine, ops.

The event-time micro-batch is the bronze commit: silver reads bronze's change
feed, so every record carries the bronze version (the source micro-batch) that
brought it. However many bronze commits one silver trigger picks up, each is
judged and advances the watermark on its own, so silver's results do not depend
on how often silver itself runs, nor on restarts.

Per silver trigger:
1. per (bronze version, source partition): largest timestamp, largest marker,
   processing time: a tiny table, collected to the driver;
2. on the driver, the shared :class:`WatermarkTracker` (kept in memory between
   batches, read back on start by :mod:`spark_jobs.eventtime.clock_log`'s rule) walks
   the versions in order: watermark before and after
   each, active and idle partitions;
3. in Spark: assign windows, judge every (record, window) pair against its
   version's starting watermark, pre-aggregate on-time pairs per (window, key);
4. writes, each idempotent under a replay of the same trigger (a labelled
   append, or Delta's txn app id/version): silver windows overwrite (partials,
   revisions, firing and closing), quarantine append (after the windows its late pairs fall
   in, so the late merge never sees a late pair before its window's on-time ones),
   and last the watermark history append, whose last row carries the partition
   clocks: the batch's one clock commit, so a crash anywhere before it replays from
   the same starting clocks, and a replay after it is skipped.
5. ``ops.watermarks``, a snapshot of the clocks, is refreshed off the hot path: after
   a batch at least ``SNAPSHOT_EVERY_S`` after the last refresh, and when the run ends.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.config import ConfigError
from spark_jobs.engine.clocks import (
    ClockMemory,
    SavedClock,
    VersionClock,
    append_batch_history,
    backlog_beyond,
    clock_memory,
    history_label,
    plan_clocks,
    recall_stream_clock,
    snapshot_label,
    write_partition_clocks,
)
from spark_jobs.engine.judging import (
    Summary,
    judged_columns,
    late_pairs_possible,
    quarantine_rows,
    read_bronze_changes,
    timed_records,
    version_summary,
)
from spark_jobs.engine.session_store import (
    JOINED,
    LATE,
    judgement_before,
    late_records,
    numbered_data,
    write_sessions,
)
from spark_jobs.engine.watermark_steps import flush
from spark_jobs.engine.window_store import write_windows
from spark_jobs.eventtime.sessions import SESSION_CLOSED
from spark_jobs.eventtime.windows import WindowSpec
from spark_jobs.faults import crash_point
from spark_jobs.jobs.common import (
    BatchWriter,
    JobContext,
    Stream,
    exit_with_named_errors,
    job_parser,
    run_stream,
    stream_session,
    writer_stream,
)
from spark_jobs.lakehouse.log import table_version
from spark_jobs.lakehouse.runs import RunTotals
from spark_jobs.sources import source_reports
from spark_jobs.transforms.windows import (
    assign_windows,
    judge_pairs,
    window_partials,
)

# A running stream refreshes the ``ops.watermarks`` snapshot after the first batch this
# long after its last refresh (each batch's clocks are in its history commit already);
# a run also refreshes it when it ends.
SNAPSHOT_EVERY_S = 30.0


class SilverBatchWriter(BatchWriter):
    def __init__(self, spark: SparkSession, context: JobContext, totals: RunTotals) -> None:
        super().__init__(spark, context, totals)
        self.snapshot_at = time.monotonic()
        self.last_batch_id: int | None = None

    @property
    def clock(self) -> ClockMemory:
        return clock_memory(self.app_id, self.context.registry)

    def write_snapshot(self) -> None:
        """Bring ``ops.watermarks`` to the clocks this stream last committed."""
        if self.last_batch_id is None:  # no batch in this run (maybe no checkpoint yet)
            return
        saved = self.clock.saved
        if saved is None or not saved.snapshot_stale:
            return
        write_partition_clocks(
            self.spark,
            self.context.registry,
            saved.tracker,
            saved.judged_version,
            (snapshot_label(self.app_id), self.last_batch_id),
            datetime.now(UTC),
        )
        crash_point("silver:clocks")
        self.clock.keep(replace(saved, snapshot_stale=False))
        self.snapshot_at = time.monotonic()

    def close(self) -> None:
        self.write_snapshot()

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        try:
            super().__call__(batch, batch_id)
        except BaseException:
            # The tracker may have moved past what committed.
            self.clock.forget()
            raise

    def write_batch(self, batch: DataFrame, batch_id: int) -> None:
        spark = self.spark
        registry = self.context.registry
        config = registry.config
        now = datetime.now(UTC)
        timed = timed_records(batch, registry)
        windows = config.window if isinstance(config.window, WindowSpec) else None
        # Windows read the records many times, so they are cached. Sessions read them
        # twice (the clock's summary, then the runs), and a second scan costs less than
        # building the cache; their records are numbered in order of time and event id.
        records = judged_columns(timed) if windows else judged_columns(timed, ("event_id",))
        if windows:
            records = records.persist()
        try:
            summary = version_summary(records, config.watermark.needs_disorder, windows)
            if not summary:
                return
            last_version = max(row.version for row in summary)
            saved = recall_stream_clock(spark, registry, self.app_id)
            if saved.judged_version is not None and last_version <= saved.judged_version:
                # A replay of a batch whose history (its clock commit, the last of its
                # writes) committed before Spark logged it. Judged again against the
                # clocks it already moved, its records would look late and reach
                # the quarantine, whose append is skipped by its label only when
                # the first run had late records to write.
                print(f"tidemark silver: batch {batch_id} was already judged; skipped", file=sys.stderr)
                self.last_batch_id = batch_id
                return
            tracker = saved.tracker
            latest = table_version(spark, registry.bronze.path)
            plan = plan_clocks(
                tracker,
                summary,
                backlog_beyond(spark, registry, last_version, latest),
                # The trigger's own versions only: a replay after a crash, with bronze
                # grown since, must plan exactly as the first run did.
                source_reports(spark, registry, summary[0].version, last_version),
            )
            if windows is None:
                per_version = self.sessions_batch(records, timed, plan, batch_id, now)
            else:
                per_version = self.windows_batch(records, timed, summary, plan, batch_id, now)
            append_batch_history(spark, registry, plan, per_version, tracker, history_label(self.app_id))
            crash_point("silver:history")
            self.clock.keep(SavedClock(tracker, last_version, snapshot_stale=True))
            self.last_batch_id = batch_id
            if time.monotonic() - self.snapshot_at >= SNAPSHOT_EVERY_S:
                self.write_snapshot()
        finally:
            records.unpersist()
        self.totals.batches += 1
        self.totals.rows_in += sum(row.rows for row in summary)
        self.totals.rows_out += sum(on for on, _ in per_version.values())
        self.totals.late += sum(late for _, late in per_version.values())

    def windows_batch(
        self,
        records: DataFrame,
        timed: DataFrame,
        summary: list[Summary],
        plan: list[VersionClock],
        batch_id: int,
        now: datetime,
    ) -> dict[int, tuple[int, int]]:
        """Judge every (record, window) pair, write the windows and the quarantine;
        per version, its (on-time, late) pairs."""
        spark, registry = self.spark, self.context.registry
        config = registry.config
        watermarks_before = {clock.version: clock.watermark_before for clock in plan}

        def pairs_of(records: DataFrame) -> DataFrame:
            data = records.where(~F.col("is_marker"))
            return judge_pairs(
                assign_windows(data, config.window), watermarks_before, config.allowed_lateness_ms
            )

        # Not cached: each use re-derives the pairs from the cached records, which
        # costs less than caching the records once more per pair.
        pairs = pairs_of(records)
        if late_pairs_possible(summary, watermarks_before, config.window, config.allowed_lateness_ms):
            counts = {
                (row.version, row.is_late): row["count"]
                for row in pairs.groupBy("version", "is_late").count().collect()
            }
        else:  # every pair is on time: the summary has counted them
            counts = Counter()
            for row in summary:
                counts[row.version, False] += row.pairs
        on_time = pairs.where(~F.col("is_late"))
        if not self.landed(registry.silver, batch_id):
            partials = window_partials(on_time, config, [clock.version for clock in plan])
            write_windows(spark, registry, partials, plan, self.label(batch_id), now)
            crash_point("silver:windows")
        if any(is_late and n for (_, is_late), n in counts.items()):
            # After the windows: a late merge between a crash and the replay would
            # otherwise create, closed, a window whose on-time pairs this batch
            # has yet to write, and the replay (which reads the windows in play only) would
            # insert it a second time.
            # Judged again from the whole batch, which carries the records' coordinates.
            late = pairs_of(timed).where("is_late")
            self.append_once(quarantine_rows(late, registry, now), registry.quarantine, batch_id)
            crash_point("silver:quarantine")
        return per_version(plan, counts)

    def sessions_batch(
        self, records: DataFrame, timed: DataFrame, plan: list[VersionClock], batch_id: int, now: datetime
    ) -> dict[int, tuple[int, int]]:
        """Judge the records key by key against the live sessions, write the sessions and
        the quarantine; per version, its (on-time, late) records."""
        spark, registry = self.spark, self.context.registry
        config = registry.config
        data = numbered_data(records, config)
        landed = self.landed_commit(registry.silver, batch_id)
        if landed is None:
            judged = write_sessions(spark, registry, data, plan, self.label(batch_id), now)
            crash_point("silver:windows")
        else:
            # A replay of a batch whose sessions committed: judged again against the
            # sessions that commit replaced, its records are where the commit put them.
            judged = judgement_before(spark, registry, data, plan, landed)
        try:
            counts = {
                (row.version, row.kind == LATE): row.records
                for row in judged.where(F.col("kind").isin(JOINED, LATE))
                .groupBy("version", "kind")
                .agg(F.sum("records").alias("records"))
                .collect()
            }
            if any(is_late and n for (_, is_late), n in counts.items()):
                # After the sessions, as for windows. Numbered again from the whole batch,
                # which carries the records' coordinates: into the same runs and members.
                late = late_records(numbered_data(timed, config), judged, config)
                self.append_once(
                    quarantine_rows(late, registry, now, SESSION_CLOSED),
                    registry.quarantine,
                    batch_id,
                )
                crash_point("silver:quarantine")
        finally:
            judged.unpersist()
        return per_version(plan, counts)


def per_version(
    plan: list[VersionClock], counts: Mapping[tuple[int, bool], int]
) -> dict[int, tuple[int, int]]:
    """Per version of ``plan``, its (on-time, late) count of ``counts`` by (version, is late)."""
    return {
        clock.version: (counts.get((clock.version, False), 0), counts.get((clock.version, True), 0))
        for clock in plan
    }


def stream(spark: SparkSession, context: JobContext) -> Stream:
    """Silver's query in this session, ready to start."""
    return writer_stream(
        spark, context, lambda: read_bronze_changes(spark, context.registry), SilverBatchWriter
    )


def run(spark: SparkSession, context: JobContext) -> int:
    """Run silver in this session (replays and benchmarks share one session)."""
    return run_stream(stream(spark, context))


@exit_with_named_errors
def main(argv: list[str] | None = None) -> int:
    parser = job_parser(
        "silver",
        "Event-time windows, quarantine and watermarks from bronze.",
        (
            "tidemark silver --pipeline telemetry --interval 30s",
            "tidemark silver --pipeline telemetry --trigger available-now --flush",
        ),
    )
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
    spark = stream_session(context)
    code = run(spark, context)
    if code == 0 and args.flush:
        flush(spark, context.registry, after_stream=context.checkpoint)
    return code


if __name__ == "__main__":
    sys.exit(main())
