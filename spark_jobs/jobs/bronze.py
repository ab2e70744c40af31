"""Bronze: source -> parse -> assign timestamps -> bronze + ops.rejects.

Exactly-once: the streaming checkpoint decides which input each micro-batch
holds; both Delta writes carry (txnAppId = the query id, txnVersion = batch id),
so a batch replayed after a crash is skipped by Delta where it already landed.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.jobs.common import (
    BatchWriter,
    JobContext,
    RunTotals,
    exit_on_config_error,
    job_parser,
    run_stream,
    start_stream,
)
from spark_jobs.session import build_session
from spark_jobs.sources import read_source
from spark_jobs.tables import TableRef
from spark_jobs.transforms.parse import bronze_rows, parse_records, reject_rows


def idempotent_append(frame: DataFrame, table: TableRef, app_id: str, batch_id: int) -> None:
    (
        frame.write.format("delta")
        .mode("append")
        .option("txnAppId", app_id)
        .option("txnVersion", batch_id)
        .save(table.path)
    )


class BronzeBatchWriter(BatchWriter):
    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        registry = self.context.registry
        now = datetime.now(UTC)
        parsed = parse_records(batch, registry.config, now).persist()
        try:
            counts = {
                row.valid: row["count"]
                for row in parsed.groupBy(F.col("reason").isNull().alias("valid")).count().collect()
            }
            valid, rejected = counts.get(True, 0), counts.get(False, 0)
            if valid:
                idempotent_append(
                    bronze_rows(parsed, registry.bronze.schema.fieldNames()),
                    registry.bronze,
                    self.app_id,
                    batch_id,
                )
            if rejected:
                rejects = reject_rows(parsed, registry.config.name, now)
                idempotent_append(rejects, registry.ops["rejects"], self.app_id, batch_id)
        finally:
            parsed.unpersist()
        self.totals.batches += 1
        self.totals.rows_in += valid + rejected
        self.totals.rows_out += valid
        self.totals.rejected += rejected


@exit_on_config_error
def main(argv: list[str] | None = None) -> int:
    parser = job_parser("bronze", "Ingest a pipeline's source into bronze and ops.rejects.")
    context = JobContext.from_args("bronze", parser.parse_args(argv))
    return run(build_session(f"tidemark-bronze-{context.config.name}"), context)


def run(spark: SparkSession, context: JobContext) -> int:
    """Run bronze in this session (replays and benchmarks share one session)."""
    context.registry.create_missing(spark)
    totals = RunTotals()
    writer = BronzeBatchWriter(spark, context, totals)
    return run_stream(
        spark, context, lambda: start_stream(read_source(spark, context.registry), context, writer), totals
    )


if __name__ == "__main__":
    sys.exit(main())
