"""Kafka: one topic; Kafka's partition, offset and record timestamp become
``source_partition``, ``source_offset`` and ``ingest_time``."""

from __future__ import annotations

import sys

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.config import PipelineConfig
from spark_jobs.sources.progress import SourceProgress, kafka_batch_offsets
from spark_jobs.tables import read_text


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


class KafkaLatestOffsets:
    """The topic's log-end offset per partition, asked of the brokers on every call
    (a metadata refresh first, so a partition added to the topic shows up at once).
    One consumer serves a job's whole run; it never joins a group or commits."""

    def __init__(self, bootstrap_servers: str, topic: str, timeout_ms: int = 10_000) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.timeout_ms = timeout_ms
        self._consumer = None

    def __call__(self) -> dict[str, int]:
        from kafka import KafkaConsumer, TopicPartition

        if self._consumer is None:
            self._consumer = KafkaConsumer(
                bootstrap_servers=self.bootstrap_servers,
                enable_auto_commit=False,
                request_timeout_ms=self.timeout_ms,
                bootstrap_timeout_ms=self.timeout_ms,
            )
        self._consumer.topics()  # refreshes the cluster metadata
        partitions = self._consumer.partitions_for_topic(self.topic) or set()
        ends = self._consumer.end_offsets([TopicPartition(self.topic, p) for p in sorted(partitions)])
        return {str(partition.partition): offset for partition, offset in ends.items()}

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def kafka_progress(
    spark: SparkSession, checkpoint: str, batch_id: int, latest_offsets: KafkaLatestOffsets
) -> SourceProgress:
    """Every partition of the topic with the batch's end offset (from the offset log
    Spark wrote before running the batch) and the topic's latest offset now. A broker
    that does not answer leaves the lag unknown: ingest goes on, and says so."""
    end = kafka_batch_offsets(read_text(spark, checkpoint, "offsets", str(batch_id)), latest_offsets.topic)
    try:
        latest = latest_offsets()
    except Exception as error:  # kafka-python raises many kinds; none should stop ingest
        print(f"tidemark bronze: Kafka's latest offsets unknown ({error}); lag not reported", file=sys.stderr)
        latest = {}
    return SourceProgress.of_offsets(end, latest)
