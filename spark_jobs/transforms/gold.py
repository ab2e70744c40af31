"""Gold: the configured rollup of fired and closed silver windows (or sessions) to a
coarser grain and a subset of the key (DESIGN §3), as DataFrame -> DataFrame steps.
A session counts in the grain it starts in.

Gold rows are recomputed whole from silver for the (grain, group) keys that
changed, never patched: a recomputation is idempotent, so a replayed batch, a
retried MERGE, or the gold stream and the late merge refreshing the same key
all converge on the same row.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.config import GoldConfig, PipelineConfig
from spark_jobs.eventtime.model import CLOSED, FIRED
from spark_jobs.eventtime.windows import SessionSpec
from spark_jobs.transforms.aggregates import measure_rollups

ROLLED_UP_STATUSES = (FIRED, CLOSED)


def _gold(config: PipelineConfig) -> GoldConfig:
    if config.gold is None:
        raise ValueError(f"pipeline {config.name!r} has no gold section")
    return config.gold


def silver_start(config: PipelineConfig) -> str:
    """The silver column whose grain a row counts in: its window's or its session's start."""
    return "session_start" if isinstance(config.window, SessionSpec) else "window_start"


def count_column(config: PipelineConfig) -> str:
    """The gold column that counts the silver rows of a grain."""
    return "session_count" if isinstance(config.window, SessionSpec) else "window_count"


def grain_start(config: PipelineConfig) -> Column:
    """The grain a silver row falls in: aligned like the windows (same offset), or for
    sessions, which have no alignment of their own, to the epoch."""
    grain = _gold(config).grain_ms
    offset = 0 if isinstance(config.window, SessionSpec) else config.window.offset_ms
    start_ms = F.unix_millis(F.col(silver_start(config)))
    aligned = start_ms - F.pmod(start_ms - F.lit(offset), F.lit(grain))
    return F.timestamp_millis(aligned)


def grain_keys(silver_rows: DataFrame, config: PipelineConfig) -> DataFrame:
    """The distinct (grain_start, group_by...) keys that ``silver_rows`` fall in."""
    return silver_rows.select(grain_start(config).alias("grain_start"), *_gold(config).group_by).distinct()


def rolled_up(silver: DataFrame) -> DataFrame:
    """The silver rows gold counts: fired or closed (an open one may grow, a merged
    session lives on in the one it merged into)."""
    return silver.where(F.col("status").isin(*ROLLED_UP_STATUSES))


def rollup(silver: DataFrame, config: PipelineConfig) -> DataFrame:
    """Fired and closed silver windows or sessions -> one gold row per (grain, group):
    records, windows or sessions, distinct keys (e.g. active devices) and every measure, merged from
    the windows' mergeable state (avg from sums and counts, distinct counts from
    the union of HLL sketches)."""
    gold = _gold(config)
    rolled = rolled_up(silver).withColumn("grain_start", grain_start(config))
    return (
        rolled.groupBy("grain_start", *gold.group_by)
        .agg(
            F.sum("record_count").cast("long").alias("record_count"),
            F.count(F.lit(1)).alias(count_column(config)),
            F.count_distinct(*[F.col(column) for column in config.key]).alias("key_count"),
            *measure_rollups(config),
        )
        .withColumn("grain_end", F.timestamp_millis(F.unix_millis("grain_start") + F.lit(gold.grain_ms)))
    )
