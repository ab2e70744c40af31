"""Kafka: one topic; Kafka's partition, offset and record timestamp become
``source_partition``, ``source_offset`` and ``ingest_time``."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.config import PipelineConfig


def read_kafka(spark: SparkSession, config: PipelineConfig) -> DataFrame:
    source = config.source
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", source.bootstrap_servers)
        .option("subscribe", source.topic)
        .option("startingOffsets", source.starting_offsets)
    )
    if source.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", source.max_offsets_per_trigger)
    return reader.load().select(
        F.col("value").cast("string").alias("raw"),
        F.col("partition").cast("string").alias("source_partition"),
        F.lit(None).cast("string").alias("source_file"),
        F.col("offset").alias("source_offset"),
        F.col("timestamp").alias("ingest_time"),
    )
