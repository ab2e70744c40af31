"""The window store: ``silver.<p>_windows``, partitioned by status so that a
micro-batch reads and rewrites only the open and fired windows. Partials merge
into it, revisions move, and windows fire and close as the watermark passes them."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.config import PipelineConfig, once_per_pipeline
from spark_jobs.engine.clocks import VersionClock
from spark_jobs.lakehouse.transaction import PartitionWriter, partition_writer, retry_on_conflict
from spark_jobs.sql import column_of, null_safe_match, with_constants
from spark_jobs.tables import TableRegistry
from spark_jobs.transforms.aggregates import finished_measures, merged_measures
from spark_jobs.transforms.windows import (
    CLOSED,
    IN_PLAY_STATUSES,
    in_play,
    is_cleaned,
    is_fired,
    partial_key,
    revision_columns,
    window_status,
)


def firing_update(
    watermark: Column | int, lateness_ms: int, target: str | None = None
) -> tuple[F.Column, dict[str, F.Column]]:
    """For silver rows that received nothing: (condition, assignments) that fire the
    windows ``watermark`` has passed (revision 0 -> 1) and close the ones past their
    allowed lateness. Rows already fired and not yet due to close are left alone.
    ``target`` qualifies the columns (a join's side)."""

    def column(name: str) -> F.Column:
        return F.col(name) if target is None else column_of(target, name)

    end_ms = F.unix_millis(column("window_end"))
    fires = is_fired(end_ms, watermark) & (column("revision") == 0)
    status = "status" if target is None else f"{target}.status"
    condition = in_play(status) & (fires | is_cleaned(end_ms, watermark, lateness_ms))
    revision = F.greatest(column("revision"), F.lit(1))
    return condition, {
        "revision": revision,
        "status": window_status(revision, end_ms, watermark, lateness_ms),
    }


def partial_match(config: PipelineConfig) -> Column:
    """A window in play (``t``) and a batch's partial (``s``) are the same (window, key).

    Plain equality on the columns the partials are grouped by (:func:`partial_key`), in
    their order: the join then keeps the aggregate's partitioning, and only the windows
    in play are shuffled to meet it (a null-safe match, or the partials' timestamps,
    would shuffle the partials a second time). No null is lost: a window's key columns
    are never null, since bronze rejects a data record without one (``missing_key``)."""
    in_play = [
        F.unix_millis(column_of("t", "window_start")),
        F.unix_millis(column_of("t", "window_end")),
        *(column_of("t", name) for name in config.key),
    ]
    pairs = zip(in_play, (column_of("s", name) for name in partial_key(config)), strict=True)
    return reduce(operator.and_, (left == right for left, right in pairs))


# The batch's final watermark, its time, and the run's micro-batches with the
# watermark after each (:func:`revision_columns`), as data (:func:`with_constants`).
BATCH_CONSTANTS = (
    "batch_watermark long, batch_now timestamp, run_versions array<long>, run_watermarks array<long>"
)


@dataclass(frozen=True)
class WindowUpdate:
    """What a micro-batch makes of the windows in play, for one pipeline: the join
    condition and every silver column, reading the batch's constants as columns."""

    match: Column
    columns: dict[str, Column]

    @classmethod
    def of(cls, config: PipelineConfig) -> WindowUpdate:
        lateness = config.allowed_lateness_ms
        watermark = F.col("batch_watermark")
        window_key = ("window_start", "window_end", *config.key)
        existed = F.col("t.status").isNotNull()
        received = F.col("s.record_count").isNotNull()
        due, fired = firing_update(watermark, lateness, target="t")
        moves = revision_columns(F.col("run_versions"), F.col("run_watermarks"))
        merged_revision = F.when(F.col("t.revision") >= 1, F.col("t.revision") + moves["refires"]).otherwise(
            moves["revision_if_open"]
        )
        revision = (
            F.when(existed & received, merged_revision)
            .when(existed & due, fired["revision"])
            .when(existed, F.col("t.revision"))
            .otherwise(moves["revision_if_new"])
        )
        end_ms = F.unix_millis(F.coalesce(F.col("t.window_end"), F.col("s.window_end")))
        merged = merged_measures(config)
        finished = finished_measures(config)
        columns = {
            # Equal on the key: either side's value is the window's.
            **{column: F.coalesce(column_of("t", column), column_of("s", column)) for column in window_key},
            **{
                column: F.when(existed & received, merged[column])
                .when(existed, column_of("t", column))
                .otherwise(finished[column])
                for column in merged
            },
            "revision": revision,
            "status": window_status(revision, end_ms, watermark, lateness),
            "late_merged_count": F.coalesce(F.col("t.late_merged_count"), F.lit(0).cast("long")),
            "updated_at": F.when(received | ~existed | due, F.col("batch_now")).otherwise(
                F.col("t.updated_at")
            ),
        }
        return cls(partial_match(config), columns)

    def apply(
        self, in_play_windows: DataFrame, partials: DataFrame, plan: Sequence[VersionClock], now: datetime
    ) -> DataFrame:
        """The windows in play after a micro-batch whose versions moved the watermark as
        ``plan`` says: ``partials`` (per window and key, from :func:`window_partials`)
        merged into their windows or inserted as new ones, revisions moved, and every
        window the final watermark passed fired or closed. Windows nothing changed keep
        their ``updated_at``."""
        partials = partials.select(
            "*",
            F.timestamp_millis("window_start_ms").alias("window_start"),
            F.timestamp_millis("window_end_ms").alias("window_end"),
        )
        joined = in_play_windows.alias("t").join(partials.alias("s"), self.match, "full_outer")
        constants = (
            plan[-1].watermark_after,
            now,
            [clock.version for clock in plan],
            [clock.watermark_after for clock in plan],
        )
        return with_constants(joined, constants, BATCH_CONSTANTS).select(
            *(self.columns[name].alias(name) for name in in_play_windows.columns)
        )


window_update = once_per_pipeline(WindowUpdate.of)


def updated_windows(
    in_play_windows: DataFrame,
    partials: DataFrame,
    config: PipelineConfig,
    plan: Sequence[VersionClock],
    now: datetime,
) -> DataFrame:
    """The windows in play after a micro-batch whose versions moved the watermark as
    ``plan`` says (:meth:`WindowUpdate.apply`)."""
    return window_update(config).apply(in_play_windows, partials, plan, now)


def fired_windows(in_play_windows: DataFrame, watermark: int, lateness_ms: int, now: datetime) -> DataFrame:
    """The windows in play after a watermark step without records (end of input,
    idleness): those the watermark passed fired, those past their allowed lateness
    closed (:func:`firing_update`), the rest as they were."""
    due, fired = firing_update(watermark, lateness_ms)
    values = {**fired, "updated_at": F.lit(now).cast("timestamp")}
    return in_play_windows.select(
        *(
            F.when(due, values[name]).otherwise(F.col(name)).alias(name) if name in values else F.col(name)
            for name in in_play_windows.columns
        )
    )


def with_late_partials(
    closed: DataFrame, partials: DataFrame, config: PipelineConfig, now: datetime
) -> DataFrame:
    """Closed windows with the partials (per window and key, from quarantined late
    pairs) folded in: a window that has one gets revision + 1 and its records counted
    as late-merged; a window only late records fell in is inserted, closed; the rest
    are as they were."""
    window_key = ("window_start", "window_end", *config.key)
    existed = F.col("t.status").isNotNull()
    received = F.col("s.record_count").isNotNull()
    merged, finished = merged_measures(config), finished_measures(config)
    late = F.coalesce(F.col("s.record_count"), F.lit(0))
    columns = {
        **{column: F.coalesce(column_of("t", column), column_of("s", column)) for column in window_key},
        **{
            column: F.when(existed & received, merged[column])
            .when(existed, column_of("t", column))
            .otherwise(finished[column])
            for column in merged
        },
        "revision": F.when(existed & received, F.col("t.revision") + 1).otherwise(
            F.coalesce(F.col("t.revision"), F.lit(1))
        ),
        "status": F.coalesce(F.col("t.status"), F.lit(CLOSED)),
        "late_merged_count": F.coalesce(F.col("t.late_merged_count"), F.lit(0)) + late,
        "updated_at": F.when(received, F.lit(now).cast("timestamp")).otherwise(F.col("t.updated_at")),
    }
    joined = closed.alias("t").join(partials.alias("s"), null_safe_match(window_key), "full_outer")
    return joined.select(*(columns[name].alias(name) for name in closed.columns))


def in_play_writer(registry: TableRegistry) -> PartitionWriter:
    """This process's writer of silver's windows in play, and the files it knows."""
    return partition_writer(registry.silver.path, "status", IN_PLAY_STATUSES)


def write_windows(
    spark: SparkSession,
    registry: TableRegistry,
    partials: DataFrame,
    plan: Sequence[VersionClock],
    label: str,
    now: datetime,
) -> None:
    """Replace the windows in play with what this micro-batch makes of them
    (:func:`updated_windows`), in one Delta commit labelled ``label``: windows it
    closes land in the closed partition beside them. Closed windows are neither
    read nor rewritten (DESIGN §4b). The commit names the files it replaces
    (:class:`~spark_jobs.lakehouse.transaction.PartitionWriter`), so a stream's batch costs what
    an append costs."""
    writer = in_play_writer(registry)
    config = registry.config
    retry_on_conflict(
        lambda: writer.overwrite(
            spark, lambda windows: updated_windows(windows, partials, config, plan, now), label
        ),
        "silver windows write",
    )


def fire_due(spark: SparkSession, registry: TableRegistry, watermark: int, label: str, now: datetime) -> None:
    """Fire the windows ``watermark`` has passed and close those past their allowed
    lateness, for a watermark step that brings no records (end of input, idleness),
    in one commit labelled ``label``. Firing twice at one watermark changes nothing, so a
    step repeated after a crash needs no transaction id."""
    writer = in_play_writer(registry)
    lateness = registry.config.allowed_lateness_ms

    def fired(windows: DataFrame) -> DataFrame:
        return fired_windows(windows, watermark, lateness, now)

    retry_on_conflict(lambda: writer.overwrite(spark, fired, label), "silver firing")
