"""`make bench`: throughput of bronze and silver against plain Spark, in one run.

Not a test: it prints a table and writes every figure to bench-results.json at
the repository root (one key per figure). Generated scooter events land as
JSON-lines files; then, in one SparkSession:

- bronze (available-now) vs a plain Spark JSON -> Delta batch copy of the same files;
- silver (available-now) over that bronze table vs a native Structured Streaming
  ``withWatermark`` + ``window`` aggregation (available-now) over the same table.

Every measured path first runs once on a small sample in a throwaway lakehouse,
so no contender pays the JVM's warm-up (class loading, JIT) for the others.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_jobs.config import PipelineConfig, load_pipeline
from spark_jobs.generator import FleetSpec, Generated, generate, write_landing
from spark_jobs.jobs import bronze, silver
from spark_jobs.jobs.common import JobContext
from spark_jobs.session import build_session
from spark_jobs.tables import TableRegistry, join

REPO = Path(__file__).resolve().parents[2]
PIPELINE = REPO / "spark_jobs" / "pipelines" / "telemetry.yaml"
WARM_UP_EVENTS = 40_000


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def measure(
    spark: SparkSession,
    config: PipelineConfig,
    records: Sequence[Generated],
    work: Path,
    records_per_file: int,
) -> dict[str, float]:
    """Seconds taken by each contender over ``records``, in a lakehouse under ``work``."""
    registry = TableRegistry(config, str(work / "lakehouse"))
    write_landing(records, registry.landing_path, records_per_file)
    registry.create_missing(spark)
    checkpoints = join(registry.root, "_checkpoints")

    def context(job: str) -> JobContext:
        return JobContext(job, config, registry, "available-now", 1_000, join(checkpoints, job))

    schema = ", ".join(f"{name} {kind}" for name, kind in config.schema.items())

    def plain_copy() -> None:
        spark.read.schema(schema).json(registry.landing_path).write.format("delta").save(
            str(work / "plain_copy")
        )

    def native_silver() -> None:
        (
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
            .start(str(work / "native_silver"))
            .awaitTermination()
        )

    return {
        "bronze": timed(lambda: bronze.run(spark, context("bronze"))),
        "plain_copy": timed(plain_copy),
        "silver": timed(lambda: silver.run(spark, context("silver"))),
        "native": timed(native_silver),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--records-per-file", type=int, default=20_000)
    parser.add_argument("--output", type=Path, default=REPO / "bench-results.json")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tidemark-bench-"))
    try:
        config = load_pipeline(PIPELINE)
        devices = 1_000
        spec = FleetSpec(
            devices=devices,
            partitions=8,
            seed=7,
            duration_ms=args.events * 10_000 // devices,
            offline_ratio=0.0,
        )
        records = generate(spec)[: args.events]
        events = len(records)

        spark = build_session("tidemark-bench", overrides={"spark.ui.enabled": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        measure(spark, config, records[:WARM_UP_EVENTS], work / "warm-up", args.records_per_file // 4)
        seconds = measure(spark, config, records, work / "measured", args.records_per_file)

        results = {
            "events": events,
            "bronze_seconds": round(seconds["bronze"], 2),
            "plain_copy_seconds": round(seconds["plain_copy"], 2),
            "bronze_events_per_s": round(events / seconds["bronze"]),
            "plain_copy_events_per_s": round(events / seconds["plain_copy"]),
            "bronze_vs_copy": round(seconds["plain_copy"] / seconds["bronze"], 3),
            "silver_seconds": round(seconds["silver"], 2),
            "native_seconds": round(seconds["native"], 2),
            "silver_events_per_s": round(events / seconds["silver"]),
            "native_events_per_s": round(events / seconds["native"]),
            "silver_vs_native": round(seconds["native"] / seconds["silver"], 3),
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
