"""The window store: ``silver.<p>_windows``, partitioned by status so that a
micro-batch reads and rewrites only the open and fired windows. Partials merge
into it, revisions move, and windows fire and close as the watermark passes them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.engine.clocks import VersionClock
from spark_jobs.jobs.common import (
    delta_txn,
    retry_on_conflict,
)
from spark_jobs.sql import column_of, null_safe_match
from spark_jobs.tables import TableRegistry
from spark_jobs.transforms.aggregates import finished_measures, merged_measures
from spark_jobs.transforms.windows import (
    in_play,
    is_cleaned,
    is_fired,
    revision_columns,
    window_status,
)


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

    # Read twice (the quiet windows' anti-join, the source) and once more by the MERGE's
    # own materialization: computed once from the batch's records.
    partials = partials.persist()
    try:
        retry_on_conflict(merge, "silver MERGE")
    finally:
        partials.unpersist()


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
