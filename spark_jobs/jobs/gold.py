"""Gold: silver changes -> the rollup, for the (grain, group) keys that changed.

Reads silver's change feed and keeps the rows a commit changed (silver's
overwrite rewrites the windows in play, changed or not). Per micro-batch, the keys
whose fired or closed windows changed (a window fired, closed, or got a new
revision) are recomputed from the silver table and MERGEd into gold, with
(txnAppId = query id, txnVersion = batch id) so a replayed batch is a no-op. The
late-merge job refreshes gold through :func:`refresh_gold` as well.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import UTC, datetime

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from spark_jobs.jobs.common import (
    BatchWriter,
    JobContext,
    Stream,
    crash_point,
    delta_txn,
    exit_on_config_error,
    job_parser,
    retry_on_conflict,
    run_if_configured,
    writer_stream,
)
from spark_jobs.session import build_session
from spark_jobs.sql import local_rows, null_safe_match
from spark_jobs.tables import TableRegistry, change_feed, changed_rows
from spark_jobs.transforms.gold import grain_keys, rolled_up, rollup


def read_silver_changes(spark: SparkSession, registry: TableRegistry) -> DataFrame:
    """Silver's change feed, every change type: a micro-batch keeps the rows that
    changed (:func:`changed_rows`)."""
    return change_feed(spark.readStream, registry.silver.path)


def changed_keys(silver_rows: DataFrame, registry: TableRegistry) -> list[Row]:
    """(grain start in epoch millis, group_by...) of every gold row ``silver_rows`` touch."""
    group_by = registry.config.gold.group_by
    keys = grain_keys(silver_rows, registry.config)
    return keys.select(F.unix_millis("grain_start").alias("grain_ms"), *group_by).collect()


def refresh_gold(
    spark: SparkSession,
    registry: TableRegistry,
    keys: Sequence[Row],
    now: datetime,
    txn: tuple[str, int] | None = None,
) -> int:
    """Recompute the gold rows of ``keys`` (from :func:`changed_keys`) from silver
    and MERGE them; returns how many keys were refreshed. Both sides of the MERGE
    are pruned to the keys' grains, so the cost follows the keys, not the tables."""
    if not keys:
        return 0
    config = registry.config
    gold = config.gold
    columns = ("grain_start", *gold.group_by)
    key_schema = StructType([StructField("grain_ms", LongType(), False), *registry.key_fields(gold.group_by)])
    lowest = datetime.fromtimestamp(min(key.grain_ms for key in keys) / 1000, UTC)
    highest = datetime.fromtimestamp((max(key.grain_ms for key in keys) + gold.grain_ms) / 1000, UTC)

    def merge() -> None:
        wanted = local_rows(spark, list(keys), key_schema).select(
            F.timestamp_millis("grain_ms").alias("grain_start"), *gold.group_by
        )
        silver = (
            spark.read.format("delta")
            .load(registry.silver.path)
            .where((F.col("window_start") >= F.lit(lowest)) & (F.col("window_start") < F.lit(highest)))
        )
        fresh = (
            rollup(silver, config)
            .join(F.broadcast(wanted), list(columns), "left_semi")
            .withColumn("updated_at", F.lit(now).cast("timestamp"))
        )
        in_grains = (F.col("t.grain_start") >= F.lit(lowest)) & (F.col("t.grain_start") < F.lit(highest))
        condition = in_grains & null_safe_match(columns)
        statement = (
            DeltaTable.forPath(spark, registry.gold.path)
            .alias("t")
            .merge(fresh.alias("s"), condition)
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
        )
        if txn is None:
            statement.execute()
        else:
            with delta_txn(spark, *txn):
                statement.execute()

    retry_on_conflict(merge, "gold MERGE")
    return len(keys)


class GoldBatchWriter(BatchWriter):
    def write_batch(self, batch: DataFrame, batch_id: int) -> None:
        registry = self.context.registry
        keys = changed_keys(rolled_up(changed_rows(batch)), registry)
        refreshed = refresh_gold(
            self.spark, registry, keys, datetime.now(UTC), (f"{self.app_id}:gold", batch_id)
        )
        crash_point("gold:gold")
        self.totals.batches += 1
        self.totals.rows_out += refreshed


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


@exit_on_config_error
def main(argv: list[str] | None = None) -> int:
    parser = job_parser("gold", "The gold rollup of fired and closed silver windows.")
    context = JobContext.from_args("gold", parser.parse_args(argv))
    spark = build_session(f"tidemark-gold-{context.config.name}")
    return run(spark, context)


if __name__ == "__main__":
    sys.exit(main())
