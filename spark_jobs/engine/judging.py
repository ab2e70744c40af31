"""Judging a silver micro-batch (DESIGN §2, §4b): bronze read as a stream of
inserts tagged with their bronze version (the event-time micro-batch), what the
watermark generators need of each version, and the quarantine rows of late pairs.
The per-record rules are the DataFrame functions of ``transforms.windows``."""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.tables import TableRegistry, change_feed
from spark_jobs.transforms.windows import (
    is_marker,
    record_millis,
)

LATE_REASON = "window_cleaned"


# (version, partition, max data ts, max marker, processing ms, rows)
Summary = tuple[int, str, int | None, int | None, int, int]


def read_bronze_changes(spark: SparkSession, registry: TableRegistry) -> DataFrame:
    """Bronze as a stream of inserts, each tagged with its bronze commit ``version``."""
    return (
        change_feed(spark.readStream, registry.bronze.path)
        .where(F.col("_change_type") == "insert")
        .withColumnRenamed("_commit_version", "version")
        .drop("_change_type", "_commit_timestamp")
    )


def timed_records(changes: DataFrame, registry: TableRegistry) -> DataFrame:
    """Bronze rows with ``ts_ms`` (the time characteristic) and ``is_marker``."""
    config = registry.config
    return changes.withColumn("ts_ms", record_millis(config)).withColumn("is_marker", is_marker(config))


def version_summary(records: DataFrame) -> list[Summary]:
    """Per bronze version and partition, what the watermark generators need."""
    rows = (
        records.groupBy("version", "source_partition")
        .agg(
            F.max(F.when(~F.col("is_marker"), F.col("ts_ms"))).alias("max_ts"),
            F.max(F.when(F.col("is_marker"), F.col("ts_ms"))).alias("max_marker"),
            F.max(F.unix_millis("processing_time")).alias("processing_ms"),
            F.count(F.lit(1)).alias("rows"),
        )
        .collect()
    )
    return sorted(
        (r.version, r.source_partition, r.max_ts, r.max_marker, r.processing_ms, r.rows) for r in rows
    )


def quarantine_rows(late: DataFrame, registry: TableRegistry, now: datetime) -> DataFrame:
    moment = F.lit(now).cast("timestamp")
    return late.select(
        *registry.bronze.schema.fieldNames(),
        F.timestamp_millis("window_start_ms").alias("window_start"),
        F.timestamp_millis("window_end_ms").alias("window_end"),
        F.col("watermark"),
        (F.col("watermark") - F.col("ts_ms")).alias("lateness_ms"),
        F.lit(LATE_REASON).alias("reason"),
        F.lit("pending").alias("status"),
        moment.alias("quarantined_at"),
        F.lit(None).cast("timestamp").alias("merged_at"),
        F.lit(None).cast("string").alias("merge_run_id"),
    )
