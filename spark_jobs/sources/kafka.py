"""Kafka: one topic; Kafka's partition, offset and record timestamp become
``source_partition``, ``source_offset`` and ``ingest_time``."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.config import PipelineConfig
from spark_jobs.lakehouse.files import read_text
from spark_jobs.sources.progress import (
    PartitionOffsets,
    SourceProgress,
    kafka_batch_offsets,
    kafka_lag,
    lag_stall,
)


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
        F.lit(None).cast("string").alias("source_name"),
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

    def _open(self):
        from kafka import KafkaConsumer

        if self._consumer is None:
            self._consumer = KafkaConsumer(
                bootstrap_servers=self.bootstrap_servers,
                enable_auto_commit=False,
                request_timeout_ms=self.timeout_ms,
                bootstrap_timeout_ms=self.timeout_ms,
            )
        return self._consumer

    def __call__(self) -> dict[str, int]:
        from kafka import TopicPartition

        consumer = self._open()
        consumer.topics()  # refreshes the cluster metadata
        partitions = consumer.partitions_for_topic(self.topic) or set()
        ends = consumer.end_offsets([TopicPartition(self.topic, p) for p in sorted(partitions)])
        return {str(partition.partition): offset for partition, offset in ends.items()}

    def record_times(self, offsets: Mapping[str, int]) -> dict[str, int]:
        """The broker timestamp (epoch ms) of the record at each partition's offset;
        a partition whose record cannot be read in time (removed by retention, say)
        is left out."""
        from kafka import TopicPartition

        consumer = self._open()
        found = {}
        for partition, offset in offsets.items():
            topic_partition = TopicPartition(self.topic, int(partition))
            consumer.assign([topic_partition])
            consumer.seek(topic_partition, offset)
            deadline = time.monotonic() + self.timeout_ms / 1000
            while partition not in found and time.monotonic() < deadline:
                fetched = consumer.poll(timeout_ms=500, max_records=1).get(topic_partition, [])
                if fetched:
                    found[partition] = fetched[0].timestamp
        return found

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


@dataclass(frozen=True)
class KafkaBacklog:
    """Unread input at the topic: records per partition beyond what bronze's last
    batch consumed, and the broker timestamp of each partition's first unread one."""

    lag: dict[str, int]
    oldest_unread_ms: dict[str, int]

    def stall(self, now: datetime, stall_after_ms: int) -> str | None:
        return lag_stall(self.lag, self.oldest_unread_ms, now, stall_after_ms)


def kafka_backlog(consumed: SourceProgress, offsets: KafkaLatestOffsets) -> KafkaBacklog:
    """The topic now against bronze's last report (``consumed``): the one rule the
    idleness check and the Airflow page both apply."""
    lag = kafka_lag(consumed, offsets())
    # A partition added to the topic since bronze's last batch is unread from its start.
    first_unread = {
        partition: consumed.partitions.get(partition, PartitionOffsets(0)).end or 0 for partition in lag
    }
    return KafkaBacklog(lag, offsets.record_times(first_unread))
