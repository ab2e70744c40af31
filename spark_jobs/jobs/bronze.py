"""Bronze: source -> parse -> assign timestamps -> bronze + ops.rejects.

Exactly-once: the streaming checkpoint decides which input each micro-batch
holds. The bronze commit is labelled with (query id, batch id), so a batch
replayed after a crash is skipped where it already landed; the rejects append
carries them as a Delta transaction id (txnAppId, txnVersion).
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime

from py4j.protocol import Py4JJavaError
from pyspark.errors.exceptions.captured import CapturedException
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from spark_jobs.config import ConfigError, PipelineConfig
from spark_jobs.faults import crash_point
from spark_jobs.jobs.common import (
    BatchWriter,
    JobContext,
    Stream,
    exit_with_named_errors,
    job_parser,
    run_stream,
    stream_session,
    writer_stream,
)
from spark_jobs.jvm import java_class
from spark_jobs.lakehouse.runs import RunTotals
from spark_jobs.sources import read_source
from spark_jobs.sources.kafka import KafkaLatestOffsets, kafka_progress
from spark_jobs.sources.progress import SourceProgress, written_metadata
from spark_jobs.transforms.parse import bronze_rows, parse_records, reject_rows


def counted(frame: DataFrame, *also: Column, **counts: Column) -> tuple[DataFrame, Observation]:
    """``frame`` with named counts (and the aggregates ``also``) observed while an
    action runs over it.

    The observation also stops the optimizer from pushing a later filter into the
    parse, where it would inline ``from_json`` once per field it reads."""
    observation = Observation()
    metrics = [F.count_if(condition).alias(name) for name, condition in counts.items()]
    return frame.observe(observation, *metrics, *also), observation


class BronzeBatchWriter(BatchWriter):
    """One parse pass writes bronze and counts the rejects on the way; a second
    pass, for ops.rejects, runs only when the batch has any. The bronze commit
    carries what the source reported for the batch (its partitions and offsets)."""

    def __init__(self, spark: SparkSession, context: JobContext, totals: RunTotals) -> None:
        super().__init__(spark, context, totals)
        source = context.config.source
        self.latest_offsets = (
            KafkaLatestOffsets(source.bootstrap_servers, source.topic) if source.kind == "kafka" else None
        )

    def source_report(self, batch_id: int) -> SourceProgress:
        if self.context.reported_progress is not None:
            return self.context.reported_progress(self.totals.batches)
        if self.latest_offsets is not None:
            return kafka_progress(self.spark, self.context.checkpoint, batch_id, self.latest_offsets)
        return SourceProgress.declared(self.context.config.source.partitions)

    def close(self) -> None:
        if self.latest_offsets is not None:
            self.latest_offsets.close()

    def write_batch(self, batch: DataFrame, batch_id: int) -> None:
        registry = self.context.registry
        now = datetime.now(UTC)
        report = self.source_report(batch_id)
        parsed = parse_records(batch, registry.config, now)
        valid = F.col("reason").isNull()
        columns = registry.bronze.schema.fieldNames()
        # Only what bronze keeps passes the observation (which the optimizer does not
        # prune through): the raw text would be copied along with every row. The
        # observation's aggregates run interpreted, so the partition a row writes is
        # a column of the generated code, not a CASE WHEN the set evaluates a row at a time.
        observed, observation = counted(
            parsed.select(*columns, "reason", F.when(valid, F.col("source_partition")).alias("written_to")),
            F.collect_set("written_to").alias("partitions"),
            valid=valid,
            rejected=~valid,
        )
        wrote = self.append_once(
            bronze_rows(observed, columns),
            registry.bronze,
            batch_id,
            report.as_metadata(),
            lambda: written_metadata(observation.get["partitions"]),
        )
        crash_point("bronze:bronze")
        if wrote:
            counts = observation.get
        else:
            # The batch landed before a crash, so the observed query never ran:
            # count the batch for the run log instead.
            recounted, _ = counted(parsed, valid=valid, rejected=~valid)
            counts = recounted.agg(
                F.count_if(valid).alias("valid"), F.count_if(~valid).alias("rejected")
            ).first()
        if counts["rejected"]:
            rejected, _ = counted(parsed, rejected=~valid)
            rejects = reject_rows(rejected, registry.config.name)
            # Labelled as bronze's other writes: a Delta transaction id would have Delta
            # rebuild the state of the rejects table, shared by every pipeline, to check it.
            self.append_once(rejects, registry.ops["rejects"], batch_id)
            crash_point("bronze:rejects")
        self.totals.batches += 1
        self.totals.rows_in += counts["valid"] + counts["rejected"]
        self.totals.rows_out += counts["valid"]
        self.totals.rejected += counts["rejected"]


@exit_with_named_errors
def main(argv: list[str] | None = None) -> int:
    parser = job_parser("bronze", "Ingest a pipeline's source into bronze and ops.rejects.")
    context = JobContext.from_args("bronze", parser.parse_args(argv))
    return run(stream_session(context), context)


def check_timezone(spark: SparkSession, config: PipelineConfig) -> None:
    """The pipeline's zone must be one Spark's Java runtime knows: its time-zone
    database can be older than Python's, and an unknown zone would fail every batch."""
    if config.event_time.is_epoch:  # epoch values carry no zone
        return
    zone_ids = java_class(spark, "java.time.ZoneId")
    try:
        zone_ids.of(config.event_time.timezone, zone_ids.SHORT_IDS)
    except (Py4JJavaError, CapturedException):  # PySpark converts most Java errors
        raise ConfigError(
            "event_time.timezone", f"{config.event_time.timezone!r} is unknown to Spark's Java runtime"
        ) from None


def stream(spark: SparkSession, context: JobContext) -> Stream:
    """Bronze's query in this session, ready to start."""
    check_timezone(spark, context.registry.config)
    return writer_stream(spark, context, lambda: read_source(spark, context.registry), BronzeBatchWriter)


def run(spark: SparkSession, context: JobContext) -> int:
    """Run bronze in this session (replays and benchmarks share one session)."""
    return run_stream(stream(spark, context))


if __name__ == "__main__":
    sys.exit(main())
