"""Gold: silver changes -> the rollup, for the (grain, group) keys that changed.

Reads silver's change feed and keeps the rows a commit changed (silver's
overwrite rewrites the windows in play, changed or not). Per micro-batch, the keys
whose fired or closed windows or sessions changed (fired, closed, got a new
revision; a session also merged or moved its start) are recomputed from the silver
table and MERGEd into gold, with (txnAppId = query id, txnVersion = batch id) so a
replayed batch is a no-op. The late-merge job refreshes gold through the same store
(:mod:`spark_jobs.engine.gold_store`).
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime

from pyspark.sql import DataFrame, SparkSession

from spark_jobs.engine.gold_store import feed_keys, refresh_gold
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
from spark_jobs.lakehouse.reads import change_feed
from spark_jobs.tables import TableRegistry


def read_silver_changes(spark: SparkSession, registry: TableRegistry) -> DataFrame:
    """Silver's change feed, every change type: a micro-batch keeps the rows that
    changed (:func:`~spark_jobs.engine.gold_store.feed_keys`)."""
    return change_feed(spark.readStream, registry.silver.path)


class GoldBatchWriter(BatchWriter):
    def write_batch(self, batch: DataFrame, batch_id: int) -> None:
        registry = self.context.registry
        keys = feed_keys(batch, registry)
        refreshed = refresh_gold(
            self.spark,
            registry,
            keys,
            datetime.now(UTC),
            self.label(batch_id),
            (f"{self.app_id}:gold", batch_id),
        )
        crash_point("gold:gold")
        self.totals.batches += 1
        self.totals.rows_out += refreshed or 0


def stream(spark: SparkSession, context: JobContext) -> Stream | None:
    """The gold query in this session, ready to start; None when the pipeline has
    no gold section."""
    registry = context.registry
    if registry.gold is None:
        return None
    return writer_stream(spark, context, lambda: read_silver_changes(spark, registry), GoldBatchWriter)


def run(spark: SparkSession, context: JobContext) -> int:
    """Run gold in this session (replays share one session)."""
    return run_if_configured(stream(spark, context), context, "gold")


@exit_with_named_errors
def main(argv: list[str] | None = None) -> int:
    parser = job_parser("gold", "The gold rollup of fired and closed silver windows.")
    context = JobContext.from_args("gold", parser.parse_args(argv))
    spark = stream_session(context)
    return run(spark, context)


if __name__ == "__main__":
    sys.exit(main())
