"""`make bench`: throughput of bronze and silver against plain Spark, in one run.

Not a test: it prints a table and writes every figure to bench-results.json at
the repository root (one key per figure). 1 M generated scooter events land as
JSON-lines files; then, in one SparkSession:

- bronze (available-now) vs a plain Spark JSON -> Delta batch copy of the same files;
- silver (available-now) over that bronze table vs a native Structured Streaming
  ``withWatermark`` + ``window`` aggregation (available-now) over the same table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from pyspark.sql import functions as F

from spark_jobs.config import load_pipeline
from spark_jobs.generator import FleetSpec, generate, write_landing
from spark_jobs.jobs import bronze, silver
from spark_jobs.jobs.common import JobContext
from spark_jobs.session import build_session
from spark_jobs.tables import TableRegistry, join

REPO = Path(__file__).resolve().parents[2]
PIPELINE = REPO / "spark_jobs" / "pipelines" / "telemetry.yaml"


def timed(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--records-per-file", type=int, default=20_000)
    parser.add_argument("--output", type=Path, default=REPO / "bench-results.json")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tidemark-bench-"))
    try:
        config = load_pipeline(PIPELINE)
        registry = TableRegistry(config, str(work / "lakehouse"))
        devices = 1_000
        spec = FleetSpec(
            devices=devices,
            partitions=8,
            seed=7,
            duration_ms=args.events * 10_000 // devices,
            offline_ratio=0.0,
        )
        records = generate(spec)[: args.events]
        write_landing(records, registry.landing_path, args.records_per_file)
        events = len(records)

        spark = build_session("tidemark-bench", overrides={"spark.ui.enabled": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        registry.create_missing(spark)
        checkpoints = join(registry.root, "_checkpoints")

        def context(job: str) -> JobContext:
            return JobContext(job, config, registry, "available-now", 1_000, join(checkpoints, job))

        bronze_s = timed(lambda: bronze.run(spark, context("bronze")))
        schema = ", ".join(f"{name} {kind}" for name, kind in config.schema.items())
        copy_s = timed(
            lambda: (
                spark.read.schema(schema)
                .json(registry.landing_path)
                .write.format("delta")
                .save(str(work / "plain_copy"))
            )
        )

        silver_s = timed(lambda: silver.run(spark, context("silver")))
        native = (
            spark.readStream.format("delta")
            .load(registry.bronze.path)
            .withWatermark("event_time", "5 seconds")
            .groupBy(F.window("event_time", "1 minute"), "region", "device_id")
            .agg(
                F.count(F.lit(1)).alias("record_count"),
                F.avg("battery").alias("battery_avg"),
                F.min("battery").alias("battery_min"),
                F.max("speed").alias("speed_max"),
            )
            .writeStream.format("delta")
            .outputMode("append")
            .option("checkpointLocation", str(work / "native_checkpoint"))
            .trigger(availableNow=True)
        )
        native_s = timed(lambda: native.start(str(work / "native_silver")).awaitTermination())

        results = {
            "events": events,
            "bronze_seconds": round(bronze_s, 2),
            "plain_copy_seconds": round(copy_s, 2),
            "bronze_events_per_s": round(events / bronze_s),
            "plain_copy_events_per_s": round(events / copy_s),
            "bronze_vs_copy": round(copy_s / bronze_s, 3),
            "silver_seconds": round(silver_s, 2),
            "native_seconds": round(native_s, 2),
            "silver_events_per_s": round(events / silver_s),
            "native_events_per_s": round(events / native_s),
            "silver_vs_native": round(native_s / silver_s, 3),
        }
        args.output.write_text(json.dumps(results, indent=2) + "\n")
        width = max(map(len, results))
        for name, value in results.items():
            print(f"{name:<{width}}  {value}")
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
