"""Offline detection: silver's watermark steps -> buffered tracks and event-time
timers -> ``gold.<p>_status_events`` (seed 003, DESIGN §2 timers).

The detector runs on the very watermark silver computed: its stream is silver's
``ops.watermark_history``, one row per judged bronze version (and one per
watermark-only step: an idleness check, the end of input). Per trigger:

1. the new steps give every bronze version's watermark before and after it;
2. the tracks of those versions are read from bronze; a track at or below its
   version's starting watermark is late and goes to ``quarantine.<p>_late_tracks``
   (the late merge re-derives its key later), the rest join the buffer;
3. buffered tracks the final watermark has passed are handled, with the key's
   timers, in event-time order (:mod:`spark_jobs.transforms.offline`); each event
   carries the first watermark step that reached it, so the table is the same
   however the steps were grouped into triggers: live or backfill;
4. writes: status events and late tracks (blind appends), then the state table
   (one commit: ``last`` rows, buffer, clock). The appends are labelled with
   (query id, batch id) and the state commit carries them as a Delta txn id, so a
   replayed batch is skipped and a crash between two writes replays from the
   same state.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.engine import claims
from spark_jobs.engine.detector import (
    StateRead,
    Steps,
    advance_detector,
    detector_clock,
    fold_claimed_tracks,
    late_track_rows,
    offline_tables,
    plan_steps,
    read_state,
    version_tracks,
)
from spark_jobs.faults import crash_point
from spark_jobs.jobs.common import (
    BatchWriter,
    JobContext,
    Stream,
    exit_with_named_errors,
    job_parser,
    run_if_configured,
    stream_session,
    writer_stream,
)
from spark_jobs.lakehouse.log import commits, readable_from_first_commit, table_version
from spark_jobs.lakehouse.runs import RunTotals
from spark_jobs.sql import local_rows
from spark_jobs.tables import TableRegistry

# A new query reads a history of at most this many commits from them, not from a
# snapshot: the same rows, without the snapshot's Spark jobs (sort and index its files),
# for a driver-side read of each commit.
FEW_HISTORY_COMMITS = 100


def read_watermark_steps(spark: SparkSession, registry: TableRegistry) -> DataFrame:
    history = registry.ops["watermark_history"].path
    reader = spark.readStream.format("delta")
    if readable_from_first_commit(spark, history, FEW_HISTORY_COMMITS):
        reader = reader.option("startingVersion", 0)
    return (
        reader.load(history).where(F.col("pipeline") == registry.config.name).select("batch_id", "watermark")
    )


class OfflineBatchWriter(BatchWriter):
    def __init__(self, spark: SparkSession, context: JobContext, totals: RunTotals) -> None:
        super().__init__(spark, context, totals)
        # The late tracks' version this writer last looked for claims at (None: never).
        self.claims_seen: int | None = None

    def write_batch(self, batch: DataFrame, batch_id: int) -> None:
        self._advance_batch(batch, batch_id)
        self._fold_claims(batch_id)

    def _fold_claims(self, batch_id: int) -> None:
        """Fold in the late tracks a merge claimed: the detector's state is this
        stream's, so it re-derives their keys itself, beside the merge's own work.
        Looked for on the first batch, then only after a claim's commit (the log
        tells, no Spark job)."""
        spark, registry = self.spark, self.context.registry
        _, _, late_table = offline_tables(registry)
        latest = table_version(spark, late_table.path)
        if self.claims_seen is not None and not any(
            claims.is_claim(commit.user_metadata)
            for commit in commits(spark, late_table.path, self.claims_seen + 1, latest)
        ):
            self.claims_seen = latest
            return
        # Not the batch's label, which marks the batch's own late tracks as landed.
        label = f"tidemark-offline-fold:{self.app_id}:{batch_id}"
        folded = fold_claimed_tracks(
            spark, registry, datetime.now(UTC), label, lambda: crash_point("offline:fold")
        )
        if folded is None:
            raise RuntimeError("another offline detector committed beside this one: run one per pipeline")
        self.claims_seen = latest

    def _advance_batch(self, batch: DataFrame, batch_id: int) -> None:
        spark = self.spark
        registry = self.context.registry
        key = registry.config.offline.key if registry.config.offline else ()
        _, state_table, late_table = offline_tables(registry)
        now = datetime.now(UTC)
        received = [(row.batch_id, row.watermark) for row in batch.collect()]
        if not received:
            return
        # The state is read once and pinned: the commit below rewrites the table it
        # was computed from.
        state = read_state(spark, state_table)
        state.rows.persist()
        try:
            clock = detector_clock(state.rows)
            steps = plan_steps(clock, received)
            if steps.after == clock:
                return
            tracks = version_tracks(spark, registry, steps.starts)
            late_count = 0
            if tracks is None:
                arrived = local_rows(spark, [], state.rows.select(*key, "ts_ms").schema)
                self._advance(state, arrived, steps, batch_id, now)
            else:
                judged = tracks.withColumn("is_late", F.col("ts_ms") <= F.col("watermark")).persist()
                try:
                    counts = {
                        row.is_late: row["count"] for row in judged.groupBy("is_late").count().collect()
                    }
                    late_count = counts.get(True, 0)
                    if late_count:
                        late = late_track_rows(judged.where("is_late"), registry, now)
                        self.append_once(late, late_table, batch_id)
                        crash_point("offline:late")
                    self._advance(
                        state, judged.where(~F.col("is_late")).select(*key, "ts_ms"), steps, batch_id, now
                    )
                    self.totals.rows_in += sum(counts.values())
                finally:
                    judged.unpersist()
        finally:
            state.rows.unpersist()
        self.totals.batches += 1
        self.totals.late += late_count

    def _advance(
        self, state: StateRead, arrived: DataFrame, steps: Steps, batch_id: int, now: datetime
    ) -> None:
        events_table, _, _ = offline_tables(self.context.registry)
        emitted = advance_detector(
            self.spark,
            self.context.registry,
            state,
            arrived,
            steps,
            (self.app_id, batch_id),
            now,
            lambda rows: self.append_once(rows, events_table, batch_id),
        )
        self.totals.rows_out += emitted


def stream(spark: SparkSession, context: JobContext) -> Stream | None:
    """The offline detection query in this session, ready to start; None when the pipeline has
    no offline section."""
    registry = context.registry
    if registry.config.offline is None:
        return None
    return writer_stream(spark, context, lambda: read_watermark_steps(spark, registry), OfflineBatchWriter)


def run(spark: SparkSession, context: JobContext) -> int:
    """Run offline detection in this session (replays share one session)."""
    return run_if_configured(stream(spark, context), context, "offline")


@exit_with_named_errors
def main(argv: list[str] | None = None) -> int:
    parser = job_parser("offline", "Offline detection with buffered event-time timers.")
    context = JobContext.from_args("offline", parser.parse_args(argv))
    spark = stream_session(context)
    return run(spark, context)


if __name__ == "__main__":
    sys.exit(main())
