"""`make bench`: throughput of bronze and silver against plain Spark, the cost of
the late merge as history grows, how soon a fired window is visible in
continuous mode, what a tiny replay costs against a bare job, the rate a
continuous pipeline application keeps up with, and whether its firing delay holds
over a long run, in one run.

Not a test: it prints a table and writes every figure to bench-results.json at
the repository root (one key per figure). ``--only`` runs one of them.

Throughput: generated scooter events land as JSON-lines files; then

- bronze (available-now) vs a plain Spark JSON -> Delta batch copy of the same files,
  and vs the bronze a Spark user writes (``bronze_vs_idiomatic``: the JSON file
  stream with the schema, PERMISSIVE mode and a corrupt-record column, event time
  and ``_metadata`` columns, a Delta sink with availableNow);
- silver (available-now) over that bronze table vs a native Structured Streaming
  ``withWatermark`` + ``window`` aggregation (available-now) over the same table;
- ``tidemark tune`` of ten candidate settings (bounds, lateness, the adaptive
  generator) over that bronze table against the silver pass (``tune_10_vs_silver``).

Silver's micro-batch cost: in one session, a telemetry lakehouse takes records a
file at a time (bronze, then silver, available-now); each silver micro-batch's
time is its query's trigger execution. ``silver_small_batch_s`` is the median over
20 batches of 100 records; ``silver_history_growth`` compares batches of 600
records after a history of 300 k events with the same after 4 k (DESIGN §4b: a
batch costs what its records, the open windows and the partitions cost, never
what the history costs), warm and as a new process's first batch (its clocks
and the tables' Delta logs read anew).

Late merge: 1,000 pending quarantined records, always in the same windows,
merged into silver/gold histories of 1x and 10x size. The histories are written
directly (closed silver windows appended in time order, a commit at a time as a
stream writes them; gold their rollup), since only their size and layout matter
here. The merge prunes to the late records' windows and grains, so its time
should barely grow with the history (the issue's target: 10x/1x <= 1.5). Each
size is merged into several times, alternating sizes, with a fresh 1,000 pending
records each time; the figures are the medians.

Firing latency: bronze and silver run as continuous spark-submit streams (1 s
trigger; under the profile a continuous stream starts with, short-jobs unless
``$TIDEMARK_JVM_PROFILE`` says otherwise) while generated files land at a steady rate, each stamped with its
landing moment (bronze's ``ingest_time``). A window's watermark passes its end at
the landing of the file that carries every partition's watermark (max event time
- bound - 1 ms, combined by minimum) to the window's last millisecond; its fired
row is visible at the commit of the silver version that first shows it fired
(``fired``, or ``closed`` when one step passed its end and its allowed lateness;
silver's change feed). The figures are the median and p95 of the
difference over every fired window row: ``firing_latency_*`` from streams that
take their first records cold (the first data batch plans, compiles and loads
what the empty triggers did not), ``firing_latency_warm_*`` from streams that
first took the feed's opening seconds and judged them before the rest landed
(what a stream that has run for a while gives; the windows are the same).

Long run (``--only long-run``): a pipeline application on 1 s triggers fed a file a
second, each a minute of event time of 30 devices, for 10 minutes; the firing
delay (as above) of the last 100 windows against that of windows 10-110, which
DESIGN §4b wants equal however many commits the run has made.

Sustained throughput (``--only sustained``): a pipeline application on 1 s triggers
fed files a second at 1,000 records a second, then at higher rates, each for
``--sustained-seconds`` (5 minutes) in a fresh lakehouse, until a rate is not held:
the records it carried from the first landing to silver having judged them all fall
below 95 % of the rate offered, or the firing delay's p95 passes 5 s.
``sustained_max_rps`` is the highest rate held; each rate's queries' median batch
times, early and late, as in the long run.

Log history (``--only log-history``): a table's Delta log grown through the storage
layer's commits (a row each, a checkpoint every 100, as a stream leaves it) to 50,
500 and 5,000 commits; at each length the median time of a commit, of reading the
table's latest version, and of listing the log from its latest version through
Delta's own ``file:`` log store and through Tidemark's (``log_commit_5000_vs_50``),
after the same on a throwaway log of 50 commits.

Object storage (``--only s3``): the tiny replay and a replay of 100 k records in 10
micro-batches, each a fresh process, into a lakehouse on the local disk and into one
on a SeaweedFS server on loopback, alternated (medians; ``s3_vs_local_tiny`` and
``s3_vs_local_100k``); then the requests of each replay to the store per
micro-batch, by kind (S3A's own counters, ``s3_requests_per_batch_*``).

Every measured path first runs once in a throwaway lakehouse, so no contender
pays the JVM's warm-up (class loading, JIT) for the others: the throughput
contenders over the measured events themselves (the JIT keeps compiling well past
a small sample: after one of 40 k events, the first full-size run of each path was
up to twice as slow as the next), the others on a small sample. The throughput
figures are medians over five runs (each contender once per run, in a fresh
lakehouse).
"""

from __future__ import annotations

import argparse
import bisect
import functools
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from spark_jobs.config import PipelineConfig, load_pipeline, parse_pipeline
from spark_jobs.engine import late_merge
from spark_jobs.engine.clocks import forget_clocks
from spark_jobs.engine.judging import LATE_REASON
from spark_jobs.engine.tuning import parse_candidate, tune
from spark_jobs.generator import REGIONS, START_MS, FleetSpec, Generated, generate, write_landing
from spark_jobs.jobs import bronze, silver
from spark_jobs.jobs.common import JobContext
from spark_jobs.jobs.replay import replay
from spark_jobs.jvm import java_class
from spark_jobs.lakehouse.create import create_missing
from spark_jobs.lakehouse.log import table_version
from spark_jobs.lakehouse.table_files import forget_table_files
from spark_jobs.lakehouse.transaction import Transaction, forget_partition_writers
from spark_jobs.object_store import S3Server
from spark_jobs.servers import stop_group
from spark_jobs.session import JVM_PROFILE_VARIABLE, build_session, profile_for_records
from spark_jobs.submit import submit_command, submit_env
from spark_jobs.tables import (
    LOG_CHECKPOINT_INTERVAL,
    LOG_RETENTION,
    REMOVED_FILES_RETENTION,
    TableRef,
    TableRegistry,
    join,
)
from spark_jobs.transforms.aggregates import finished_measures, partial_aggregates
from spark_jobs.transforms.gold import rollup

REPO = Path(__file__).resolve().parents[2]
PIPELINE = REPO / "spark_jobs" / "pipelines" / "telemetry.yaml"
WARM_UP_EVENTS = 40_000

# The merge histories: every device has a closed silver window every minute, so a
# history of N windows spans N / HISTORY_DEVICES minutes.
HISTORY_DEVICES = 100
RECORDS_PER_WINDOW = 6  # a track every 10 s, as the generator sends them
WINDOWS_PER_COMMIT = 10_000
# 1,000 late records: 5 from each of 20 devices in each of the windows 01:00-01:10.
# The same windows in every history, so each merge does the same work.
LATE_FIRST_WINDOW = 60
LATE_WINDOWS = 10
LATE_DEVICES = 20
LATE_PER_WINDOW = 5
LATE_RECORDS = LATE_WINDOWS * LATE_DEVICES * LATE_PER_WINDOW
LATE_DELAY_MS = 20 * 60_000
# Two hours: the late windows' whole gold hour (the grain the merge recomputes) is in history.
MIN_HISTORY_WINDOWS = 120 * HISTORY_DEVICES


# Ten candidate settings for `tidemark tune` over the throughput history (issue 23's
# bar: at most twice one silver pass over the same events).
TUNE_CANDIDATES = (
    "1s",
    "2s",
    "5s",
    "10s",
    "30s",
    "5s+1m",
    "5s+5m",
    "monotonous",
    "spark_jobs.eventtime.adaptive:AdaptiveBound(floor=1s, ceiling=1m)",
    "spark_jobs.eventtime.adaptive:AdaptiveBound(quantile=0.9, floor=0s, ceiling=30s)",
)


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def landed(
    spark: SparkSession,
    config: PipelineConfig,
    records: Sequence[Generated],
    work: Path,
    records_per_file: int,
) -> tuple[TableRegistry, Callable[[str], JobContext]]:
    """A fresh lakehouse under ``work`` with ``records`` landed and its tables created, and
    each job's available-now context there."""
    registry = TableRegistry(config, str(work / "lakehouse"))
    write_landing(records, registry.landing_path, records_per_file)
    create_missing(spark, registry)
    checkpoints = join(registry.root, "_checkpoints")

    def context(job: str) -> JobContext:
        return JobContext(job, config, registry, "available-now", 1_000, join(checkpoints, job))

    return registry, context


def measure(
    spark: SparkSession,
    config: PipelineConfig,
    records: Sequence[Generated],
    work: Path,
    records_per_file: int,
) -> dict[str, float]:
    """Seconds taken by each contender over ``records``, in a lakehouse under ``work``."""
    registry, context = landed(spark, config, records, work, records_per_file)

    schema = ", ".join(f"{name} {kind}" for name, kind in config.schema.items())

    def plain_copy() -> None:
        spark.read.schema(schema).json(registry.landing_path).write.format("delta").save(
            str(work / "plain_copy")
        )

    def idiomatic_bronze() -> None:
        """The bronze a Spark user writes: the JSON file stream with the schema,
        PERMISSIVE mode and a corrupt-record column, event time and the file's
        metadata columns, into Delta with availableNow."""
        (
            spark.readStream.schema(f"{schema}, _corrupt_record string")
            .option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", "_corrupt_record")
            .json(registry.landing_path)
            .select(
                "*",
                F.timestamp_millis("ts").alias("event_time"),
                F.col("_metadata.file_path").alias("source_file"),
                F.col("_metadata.file_modification_time").alias("ingest_time"),
            )
            .writeStream.format("delta")
            .option("checkpointLocation", str(work / "idiomatic_checkpoint"))
            .trigger(availableNow=True)
            .start(str(work / "idiomatic_bronze"))
            .awaitTermination()
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
        "idiomatic": timed(idiomatic_bronze),
        "silver": timed(lambda: silver.run(spark, context("silver"))),
        "native": timed(native_silver),
        "tune_10": timed(
            lambda: tune(spark, registry, [parse_candidate(c, config) for c in TUNE_CANDIDATES], False)
        ),
    }


def fleet_records(events: int) -> list[Generated]:
    """``events`` records of 1,000 devices in arrival order, every partition in order."""
    devices = 1_000
    spec = FleetSpec(
        devices=devices, partitions=8, seed=7, duration_ms=events * 10_000 // devices, offline_ratio=0.0
    )
    return generate(spec)[:events]


def throughput_benchmark(
    spark: SparkSession, config: PipelineConfig, events: int, records_per_file: int, repeats: int, work: Path
) -> dict[str, float]:
    """Bronze vs a plain copy and silver vs native Spark over ``events`` generated
    events, each the median of ``repeats`` runs in fresh lakehouses."""
    records = fleet_records(events)
    events = len(records)
    # A warm-up at the measured size: after one of WARM_UP_EVENTS, the first measured run
    # was the slowest for every contender, bronze (the most generated code) by 30-40 %.
    measure(spark, config, records, work / "warm-up", records_per_file)
    runs = [
        measure(spark, config, records, work / f"measured-{run}", records_per_file) for run in range(repeats)
    ]
    seconds = {contender: statistics.median(run[contender] for run in runs) for contender in runs[0]}
    return {
        "events": events,
        "throughput_repeats": repeats,
        "bronze_seconds": round(seconds["bronze"], 2),
        "plain_copy_seconds": round(seconds["plain_copy"], 2),
        "bronze_events_per_s": round(events / seconds["bronze"]),
        "plain_copy_events_per_s": round(events / seconds["plain_copy"]),
        "bronze_vs_copy": round(seconds["plain_copy"] / seconds["bronze"], 3),
        "idiomatic_bronze_seconds": round(seconds["idiomatic"], 2),
        "bronze_vs_idiomatic": round(seconds["idiomatic"] / seconds["bronze"], 3),
        "silver_seconds": round(seconds["silver"], 2),
        "native_seconds": round(seconds["native"], 2),
        "silver_events_per_s": round(events / seconds["silver"]),
        "native_events_per_s": round(events / seconds["native"]),
        "silver_vs_native": round(seconds["native"] / seconds["silver"], 3),
        "tune_10_seconds": round(seconds["tune_10"], 2),
        "tune_10_vs_silver": round(seconds["tune_10"] / seconds["silver"], 3),
    }


# The sessions benchmark's gap, in the pipeline file's words and Spark's: the fleet's
# devices send every 10 s and go offline for half an hour or more now and then.
SESSION_GAP, SESSION_WINDOW_GAP = "1m", "1 minute"


def sessions_benchmark(
    events: int, records_per_file: int, spark: SparkSession, work: Path
) -> dict[str, float]:
    """Silver's session windows against Spark's ``session_window`` with a watermark,
    both over one bronze of ``events`` generated events: each contender once, after a
    warm-up run of both on a tenth of them."""
    document = yaml.safe_load(PIPELINE.read_text())
    config = parse_pipeline({**document, "window": {"type": "session", "gap": SESSION_GAP}, "gold": None})
    spec = FleetSpec(devices=1_000, partitions=8, seed=7, duration_ms=events * 40, offline_ratio=0.01)
    records = generate(spec)[:events]
    sessions_run(spark, config, records[: len(records) // 10], records_per_file, work / "sessions-warm-up")
    seconds = sessions_run(spark, config, records, records_per_file, work / "sessions")
    return {
        "sessions_events": len(records),
        "sessions_silver_seconds": round(seconds["silver"], 2),
        "sessions_native_seconds": round(seconds["native"], 2),
        "sessions_vs_native": round(seconds["native"] / seconds["silver"], 3),
        "sessions_events_per_s_per_core": round(len(records) / seconds["silver"] / (os.cpu_count() or 1)),
    }


def sessions_run(
    spark: SparkSession,
    config: PipelineConfig,
    records: Sequence[Generated],
    records_per_file: int,
    work: Path,
) -> dict[str, float]:
    """Seconds silver and Spark's ``session_window`` take over one bronze of ``records``."""
    registry, context = landed(spark, config, records, work, records_per_file)
    checkpoints = join(registry.root, "_checkpoints")

    bronze.run(spark, context("bronze"))

    def native() -> None:
        (
            spark.readStream.format("delta")
            .load(registry.bronze.path)
            .withWatermark("event_time", "5 seconds")
            .groupBy(F.session_window("event_time", SESSION_WINDOW_GAP), "region", "device_id")
            .agg(
                F.count(F.lit(1)).alias("record_count"),
                F.avg("battery").alias("battery_avg"),
                F.min("battery").alias("battery_min"),
                F.max("speed").alias("speed_max"),
            )
            .writeStream.format("delta")
            .outputMode("append")
            .option("checkpointLocation", join(checkpoints, "native"))
            .trigger(availableNow=True)
            .start(join(registry.root, "native_sessions"))
            .awaitTermination()
        )

    return {"silver": timed(lambda: silver.run(spark, context("silver"))), "native": timed(native)}


def quotient(dividend: str, divisor: int) -> Column:
    return F.floor(F.col(dividend) / F.lit(divisor))


def telemetry(config: PipelineConfig, cells: DataFrame) -> DataFrame:
    """One synthetic record (payload and window bounds) per (``window``, ``device``,
    ``slot``) cell; ``window`` counts windows from START_MS, ``slot`` places the
    record in its window."""
    size_ms = config.window.size_ms
    slot_ms = size_ms // RECORDS_PER_WINDOW
    start_ms = F.lit(START_MS + config.window.offset_ms) + F.col("window") * F.lit(size_ms)
    regions = F.array(*(F.lit(region) for region in REGIONS))
    return cells.withColumns(
        {
            "device_id": F.format_string("dev-%05d", F.col("device")),
            "ts": start_ms + F.col("slot") * F.lit(slot_ms) + F.pmod(F.col("device") * 7, F.lit(slot_ms)),
            "region": F.element_at(regions, (F.pmod(F.col("device"), F.lit(len(REGIONS))) + 1).cast("int")),
            "battery": 20 + F.pmod(F.col("device") * 13 + F.col("window") + F.col("slot"), F.lit(80)),
            "speed": F.pmod(F.col("device") * 7 + F.col("window") * 3 + F.col("slot"), F.lit(25)),
            "partition": F.pmod(F.col("device"), F.lit(8)),
            "window_start": F.timestamp_millis(start_ms),
            "window_end": F.timestamp_millis(start_ms + F.lit(size_ms)),
        }
    )


def history_records(spark: SparkSession, config: PipelineConfig, first: int, last: int) -> DataFrame:
    """The records of silver history windows ``[first, last)`` (in time order, a
    window of every device each minute)."""
    ids = spark.range(first * RECORDS_PER_WINDOW, last * RECORDS_PER_WINDOW)
    cells = ids.select(
        quotient("id", HISTORY_DEVICES * RECORDS_PER_WINDOW).alias("window"),
        F.pmod(quotient("id", RECORDS_PER_WINDOW), F.lit(HISTORY_DEVICES)).alias("device"),
        F.pmod(F.col("id"), F.lit(RECORDS_PER_WINDOW)).alias("slot"),
    )
    return telemetry(config, cells)


def closed_windows(config: PipelineConfig, records: DataFrame, now: datetime) -> DataFrame:
    """Silver rows for ``records``, aggregated as silver does, fired and closed."""
    partials = records.groupBy("window_start", "window_end", *config.key).agg(*partial_aggregates(config))
    return partials.alias("s").select(
        "window_start",
        "window_end",
        *config.key,
        *(column.alias(name) for name, column in finished_measures(config).items()),
        F.lit(1).alias("revision"),
        F.lit("closed").alias("status"),
        F.lit(0).alias("late_merged_count"),
        F.lit(now).alias("updated_at"),
    )


def pending_late(spark: SparkSession, config: PipelineConfig, batch: int, now: datetime) -> DataFrame:
    """The ``batch``-th LATE_RECORDS quarantine rows, as silver quarantines records
    whose window was already cleaned up: pending, not yet claimed by a merge run."""
    ids = spark.range(LATE_RECORDS)
    cells = ids.select(
        "id",
        (quotient("id", LATE_DEVICES * LATE_PER_WINDOW) + LATE_FIRST_WINDOW).alias("window"),
        F.pmod(quotient("id", LATE_PER_WINDOW), F.lit(LATE_DEVICES)).alias("device"),
        F.pmod(F.col("id"), F.lit(LATE_PER_WINDOW)).alias("slot"),
    )
    source_file = f"bench-late-{batch}.json"
    arrived = F.timestamp_millis(F.col("ts") + F.lit(LATE_DELAY_MS))
    return telemetry(config, cells).withColumns(
        {
            "event_id": F.format_string(f"{source_file}:%d", F.col("id")),
            "source_partition": F.col("partition").cast("string"),
            "source_file": F.lit(source_file),
            "source_offset": F.col("id"),
            "event_time": F.timestamp_millis(F.col("ts")),
            "ingest_time": arrived,
            "processing_time": arrived,
            "watermark": F.col("ts") + F.lit(LATE_DELAY_MS),
            "lateness_ms": F.lit(LATE_DELAY_MS),
            "reason": F.lit(LATE_REASON),
            "status": F.lit("pending"),
            "quarantined_at": F.lit(now),
            "merged_at": F.lit(None),
            "merge_run_id": F.lit(None),
        }
    )


def append(frame: DataFrame, table: TableRef) -> None:
    columns = [F.col(field.name).cast(field.dataType) for field in table.schema]
    frame.select(*columns).write.format("delta").mode("append").save(table.path)


def late_merge_history(
    spark: SparkSession, config: PipelineConfig, root: Path, history_windows: int
) -> TableRegistry:
    """A lakehouse with ``history_windows`` closed silver windows and gold rolled up from them."""
    registry = TableRegistry(config, str(root))
    create_missing(spark, registry)
    now = datetime.now(UTC)
    # A commit per stretch of time, as the silver stream writes: each file covers a
    # narrow window_start range, which is what lets the merge skip the others.
    for first in range(0, history_windows, WINDOWS_PER_COMMIT):
        last = min(first + WINDOWS_PER_COMMIT, history_windows)
        append(closed_windows(config, history_records(spark, config, first, last), now), registry.silver)
    windows = spark.read.format("delta").load(registry.silver.path)
    append(rollup(windows, config).withColumn("updated_at", F.lit(now)), registry.gold)
    return registry


def timed_merge(spark: SparkSession, config: PipelineConfig, registry: TableRegistry, batch: int) -> float:
    """Seconds the late merge of the ``batch``-th LATE_RECORDS pending records
    (counting from 0) into ``registry`` takes; checks they were all merged."""
    append(pending_late(spark, config, batch, datetime.now(UTC)), registry.quarantine)
    # The merge runs as its own spark-submit, which starts by loading each table's
    # Delta log; without this it would find the snapshots of earlier writes cached.
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    seconds = timed(lambda: late_merge.merge_late(spark, registry, late_merge.TimeRange()))
    merged = LATE_RECORDS * (batch + 1)
    quarantine = spark.read.format("delta").load(registry.quarantine.path)
    statuses = {row.status: row["count"] for row in quarantine.groupBy("status").count().collect()}
    assert statuses == {"merged": merged}, f"after merge {batch}, quarantine holds {statuses}"
    windows = spark.read.format("delta").load(registry.silver.path)
    folded = windows.agg(F.sum("late_merged_count")).first()[0]
    assert folded == merged, f"after merge {batch}, silver counts {folded} merged records, not {merged}"
    return seconds


def merge_benchmark(
    spark: SparkSession, config: PipelineConfig, history_windows: int, repeats: int, work: Path
) -> dict[str, float]:
    """The late merge over histories of ``history_windows`` and ten times as many,
    ``repeats`` times each."""
    warm_up = late_merge_history(spark, config, work / "merge-warm-up", MIN_HISTORY_WINDOWS)
    timed_merge(spark, config, warm_up, 0)
    sizes = {"1x": history_windows, "10x": 10 * history_windows}
    histories = {
        label: late_merge_history(spark, config, work / f"merge-{label}", windows)
        for label, windows in sizes.items()
    }
    seconds: dict[str, list[float]] = {label: [] for label in sizes}
    # Alternating the sizes spreads what is left of the JVM's warm-up, and the
    # machine's other load, over both.
    for batch in range(repeats):
        for label, registry in histories.items():
            seconds[label].append(timed_merge(spark, config, registry, batch))
    once, tenfold = (statistics.median(seconds[label]) for label in sizes)
    gold_rows = {
        label: spark.read.format("delta").load(registry.gold.path).count()
        for label, registry in histories.items()
    }
    return {
        "merge_late_records": LATE_RECORDS,
        "merge_repeats": repeats,
        "merge_history_windows_1x": sizes["1x"],
        "merge_history_windows_10x": sizes["10x"],
        "merge_gold_rows_1x": gold_rows["1x"],
        "merge_gold_rows_10x": gold_rows["10x"],
        "merge_1x_s": round(once, 2),
        "merge_10x_s": round(tenfold, 2),
        "merge_10x_vs_1x": round(tenfold / once, 3),
    }


def watermark_passes(
    config: PipelineConfig, landed: Sequence[tuple[str, int, float]]
) -> list[tuple[int, float]]:
    """(watermark, landing second) after each landed file, from ``landed`` rows of
    (partition, event time ms, landing second): per-partition bounded watermarks
    combined by minimum once every partition has sent."""
    bound = config.watermark.bound_ms
    partitions = {partition for partition, _, _ in landed}
    highest: dict[str, int] = {}
    steps: list[tuple[int, float]] = []
    by_landing = sorted(landed, key=lambda row: row[2])
    for landing, rows in itertools.groupby(by_landing, key=lambda row: row[2]):
        for partition, event_ms, _ in rows:
            highest[partition] = max(highest.get(partition, event_ms), event_ms)
        if set(highest) == partitions:
            steps.append((min(highest.values()) - bound - 1, landing))
    return steps


def firing_latencies(spark: SparkSession, config: PipelineConfig, registry: TableRegistry) -> list[float]:
    """Seconds from the watermark passing each fired window's end to the silver
    commit that first shows the window fired."""
    return [latency for _, latency in firing_delays(spark, config, registry)]


def firing_delays(
    spark: SparkSession, config: PipelineConfig, registry: TableRegistry
) -> list[tuple[int, float]]:
    """(window end ms, :func:`firing_latencies`' seconds) of each fired window, in
    the order of their ends."""
    landed = [
        (row.partition, row.event_ms, row.landed)
        for row in spark.read.format("delta")
        .load(registry.bronze.path)
        .selectExpr(
            "source_partition AS partition",
            "unix_millis(event_time) AS event_ms",
            "unix_micros(ingest_time) / 1e6 AS landed",
        )
        .collect()
    ]
    steps = watermark_passes(config, landed)
    fired = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 0)
        .load(registry.silver.path)
        .where("status IN ('fired', 'closed') AND _change_type IN ('insert', 'update_postimage')")
        .groupBy(*config.key, "window_end")
        .agg(F.min("_commit_timestamp").alias("visible"))
        .selectExpr("unix_millis(window_end) AS end_ms", "unix_micros(visible) / 1e6 AS visible")
        .collect()
    )
    # The combined watermark never goes back, so the first step past a window's end is found by bisection.
    watermarks = [watermark for watermark, _ in steps]
    delays = []
    for row in sorted(fired, key=lambda row: row.end_ms):
        step = bisect.bisect_left(watermarks, row.end_ms - 1)
        if step < len(steps):
            delays.append((row.end_ms, row.visible - steps[step][1]))
    return delays


def drained(spark: SparkSession, registry: TableRegistry, records: int, timeout: float = 900) -> None:
    """Wait until bronze holds every record and silver has judged them all."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(5)
        if not all(Path(table.path, "_delta_log").exists() for table in (registry.bronze, registry.silver)):
            continue
        history = spark.read.format("delta").load(registry.ops["watermark_history"].path)
        judged = history.selectExpr("coalesce(sum(on_time_count + late_count), 0)").first()[0]
        if judged >= records:
            return
    raise TimeoutError(f"silver did not judge all {records} records within {timeout:.0f} s")


def stop_stream(process: subprocess.Popen) -> None:
    """SIGTERM: the job stops its query at a batch boundary and logs its run."""
    stop_group(process, grace_s=120)


def steady_fleet(devices: int, seed: int, seconds: float, rate: float) -> list[Generated]:
    """``rate`` records a second for ``seconds`` from ``devices`` devices (a record
    every 10 s of event time each), in order: no late uploads, no offline gaps."""
    spec = FleetSpec(
        devices=devices,
        partitions=4,
        seed=seed,
        duration_ms=int(seconds * rate * 10_000 / devices),
        offline_ratio=0.0,
    )
    return generate(spec)


def start_continuous(
    job: str, registry: TableRegistry, queries: Sequence[str], interval: str = "1s"
) -> subprocess.Popen:
    """spark-submit ``job`` (continuous) on the telemetry pipeline; returns once each
    of ``queries`` has started (its checkpoint has metadata)."""
    arguments = ["--pipeline", str(PIPELINE), "--lakehouse", registry.root, "--trigger", "continuous"]
    process = subprocess.Popen(
        submit_command(job, [*arguments, "--interval", interval]),
        env=submit_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    for query in queries:
        metadata = Path(join(registry.root, "_checkpoints", registry.config.name, query, "metadata"))
        deadline = time.monotonic() + 300
        while not metadata.exists():
            if time.monotonic() > deadline:
                stop_stream(process)
                raise TimeoutError(f"{query} did not start its stream")
            time.sleep(1)
    return process


def latency_benchmark(
    spark: SparkSession, config: PipelineConfig, seconds: float, rate: float, work: Path, warm_up_s: float = 0
) -> dict[str, float]:
    """Continuous bronze and silver (1 s triggers) while files land at ``rate``
    records per second for ``seconds``, until silver has judged them all: the
    firing latency's median and p95 (a backlog, if the streams fall behind,
    counts in it). With ``warm_up_s``, the feed's first seconds land and are judged
    before the rest lands, and the figures' keys say ``warm``."""
    warm = "_warm" if warm_up_s else ""
    registry = TableRegistry(config, str(work / f"latency{warm}"))
    records = steady_fleet(200, 11, seconds, rate)
    per_file = max(1, int(rate // 2))
    opening = max(per_file, int(warm_up_s * rate) // per_file * per_file) if warm_up_s else 0
    streams = [start_continuous(job, registry, [job]) for job in ("bronze", "silver")]
    try:
        if opening:
            write_landing(records[:opening], registry.landing_path, per_file, rate=rate, prefix="opening")
            drained(spark, registry, opening)
        write_landing(records[opening:], registry.landing_path, per_file, rate=rate)
        drained(spark, registry, len(records))
    finally:
        for process in streams:
            stop_stream(process)
    latencies = sorted(firing_latencies(spark, config, registry))
    return {
        "latency_events": len(records),
        "latency_rate_per_s": rate,
        f"latency{warm}_fired_windows": len(latencies),
        f"firing_latency{warm}_median_s": round(statistics.median(latencies), 2),
        f"firing_latency{warm}_p95_s": round(percentile_95(latencies), 2),
    }


TINY_RECORDS, TINY_BATCHES = 24, 4
BARE_JOB = """
import sys
from spark_jobs.session import build_session
spark = build_session("tidemark-bare")
spark.range(24).selectExpr("id", "id * 2 AS value").write.format("delta").save(sys.argv[1])
spark.stop()
"""


def process_seconds(command: list[str], environment: dict[str, str] | None = None) -> float:
    started = time.perf_counter()
    subprocess.run(command, env={**submit_env(), **(environment or {})}, check=True, capture_output=True)
    return time.perf_counter() - started


def tiny_input(work: Path) -> Path:
    """The tiny replay's input: 24 records of 3 devices in 2 partitions."""
    records = generate(FleetSpec(devices=3, partitions=2, seed=3, duration_ms=80_000))[:TINY_RECORDS]
    source = work / "tiny.json"
    source.write_text("\n".join(record.line for record in records) + "\n")
    return source


def replay_command(source: Path, lakehouse: str, batch_size: int) -> list[str]:
    """``tidemark replay`` of ``source`` into ``lakehouse`` with ``--flush``."""
    tidemark = str(Path(sys.executable).with_name("tidemark"))
    return [
        *(tidemark, "replay", "--pipeline", str(PIPELINE), "--input", str(source)),
        *("--lakehouse", lakehouse, "--batch-size", str(batch_size), "--flush"),
    ]


def tiny_replay_benchmark(repeats: int, work: Path) -> dict[str, float | str]:
    """``tidemark replay`` of 24 records in 4 micro-batches with ``--flush``, against
    a bare job (the session factory writing 24 rows to one Delta table), each a
    fresh process from its command line to its exit; alternated, medians. The replay
    starts its JVM under the profile its input size calls for; the bare job under
    the factory's default (the issue's anchor) and under the replay's profile."""
    source = tiny_input(work)
    replays, bares, same_profile_bares = [], [], []
    replay_profile = os.environ.get(JVM_PROFILE_VARIABLE) or profile_for_records(TINY_RECORDS)
    for run in range(repeats):
        replays.append(
            process_seconds(replay_command(source, str(work / f"tiny-{run}"), TINY_RECORDS // TINY_BATCHES))
        )
        bares.append(process_seconds([sys.executable, "-c", BARE_JOB, str(work / f"bare-{run}")]))
        same_profile_bares.append(
            process_seconds(
                [sys.executable, "-c", BARE_JOB, str(work / f"bare-same-{run}")],
                {JVM_PROFILE_VARIABLE: replay_profile},
            )
        )
    replay_s, bare_s = statistics.median(replays), statistics.median(bares)
    same_profile_bare_s = statistics.median(same_profile_bares)
    return {
        "tiny_replay_seconds": round(replay_s, 2),
        "bare_job_seconds": round(bare_s, 2),
        "tiny_replay_vs_bare": round(replay_s / bare_s, 2),
        "tiny_replay_profile": replay_profile,
        "bare_job_same_profile_seconds": round(same_profile_bare_s, 2),
        "tiny_replay_vs_same_profile_bare": round(replay_s / same_profile_bare_s, 2),
    }


LARGE_REPLAY_RECORDS, LARGE_REPLAY_BATCH = 100_000, 10_000


def s3_request_counts(spark: SparkSession, bucket_uri: str) -> dict[str, int]:
    """S3A's request counters (cumulative) of the session's file system for a bucket."""
    path = java_class(spark, "org.apache.hadoop.fs.Path")(bucket_uri)
    counters = path.getFileSystem(spark._jsc.hadoopConfiguration()).getIOStatistics().counters()
    return {
        str(name): int(counters.get(name))
        for name in counters.keySet()
        if str(name).endswith(("_request", "_requests")) and not str(name).startswith("store_io")
    }


def s3_vs_local_benchmark(spark: SparkSession, repeats: int, work: Path) -> dict[str, float]:
    """The tiny replay and a replay of 100 k records in 10 micro-batches, each a
    fresh process into a lakehouse on the local disk and into one on a SeaweedFS
    server on loopback (alternated, medians); then the requests a replay of each
    makes of the store per micro-batch, by kind, from S3A's counters in this session."""
    server = S3Server(work / "s3").start()
    try:
        inputs = {"tiny": (tiny_input(work), TINY_RECORDS // TINY_BATCHES)}
        large = work / "large.json"
        large.write_text("\n".join(record.line for record in fleet_records(LARGE_REPLAY_RECORDS)) + "\n")
        inputs["100k"] = (large, LARGE_REPLAY_BATCH)
        results: dict[str, float] = {}
        for name, (source, batch_size) in inputs.items():
            local, s3 = [], []
            for run in range(repeats):
                local.append(process_seconds(replay_command(source, str(work / f"{name}-{run}"), batch_size)))
                remote = f"s3a://{server.bucket}/{name}-{run}"
                s3.append(process_seconds(replay_command(source, remote, batch_size), server.environment()))
            local_s, s3_s = statistics.median(local), statistics.median(s3)
            results |= {
                f"s3_vs_local_{name}_local_seconds": round(local_s, 2),
                f"s3_vs_local_{name}_s3_seconds": round(s3_s, 2),
                f"s3_vs_local_{name}": round(s3_s / local_s, 2),
            }
        # In this process: the replay lands its files through the environment, Spark
        # reaches the store through the session's Hadoop settings.
        os.environ.update(server.environment())
        configuration = spark._jsc.hadoopConfiguration()
        for key, value in server.hadoop_conf().items():
            configuration.set(key, value)
        bucket = f"s3a://{server.bucket}/"
        config = load_pipeline(PIPELINE)
        for name, (source, batch_size) in inputs.items():
            before = s3_request_counts(spark, bucket)
            replay(spark, config, source, f"{bucket}requests-{name}", batch_size=batch_size, flush=True)
            after = s3_request_counts(spark, bucket)
            batches = -(-sum(1 for _ in source.open()) // batch_size)
            for kind, count in after.items():
                made = count - before.get(kind, 0)
                if made:
                    results[f"s3_requests_per_batch_{name}_{kind}"] = round(made / batches, 1)
        return results
    finally:
        server.stop()


def continuous_benchmark(
    spark: SparkSession, config: PipelineConfig, seconds: float, rate: float, work: Path
) -> dict[str, float]:
    """A pipeline's four streams as one continuous application (``tidemark run``,
    1 s triggers) while files land at ``rate`` records per second for ``seconds``:
    the records per second it carried from the first landing to silver having
    judged them all (the rate it keeps up with when ``rate`` is above it)."""
    registry = TableRegistry(config, str(work / "continuous"))
    records = steady_fleet(500, 13, seconds, rate)
    application = start_continuous("run", registry, ["bronze", "silver", "gold", "offline"])
    try:
        started = time.monotonic()
        write_landing(records, registry.landing_path, max(1, int(rate)), rate=rate)
        fed = time.monotonic() - started
        drained(spark, registry, len(records), timeout=1800)
        carried = time.monotonic() - started
    finally:
        stop_stream(application)
    return {
        "continuous_offered_rps": rate,
        "continuous_events": len(records),
        "continuous_feed_seconds": round(fed, 1),
        "continuous_sustained_rps": round(len(records) / carried),
    }


LONG_RUN_DEVICES, LONG_RUN_PARTITIONS = 30, 3
LONG_RUN_WINDOWS = 100


def long_run_benchmark(
    spark: SparkSession, config: PipelineConfig, seconds: int, work: Path
) -> dict[str, float]:
    """A pipeline application (``tidemark run``, 1 s triggers) fed a file a second for
    ``seconds``, each file a minute of event time of LONG_RUN_DEVICES devices (a record
    each), so that every file closes windows: how the firing delay moves as the
    pipeline's commits pile up. ``long_run_delay_ratio`` is the median delay of the
    last LONG_RUN_WINDOWS windows over that of windows 10-110 (the first ten pay the
    JVM's warm-up); ``long_run_worst_p95_s`` the highest p95 of any run of
    LONG_RUN_WINDOWS consecutive windows."""
    registry = TableRegistry(config, str(work / "long-run"))
    spec = FleetSpec(
        devices=LONG_RUN_DEVICES,
        partitions=LONG_RUN_PARTITIONS,
        seed=17,
        duration_ms=seconds * 60_000,
        interval_ms=60_000,
        offline_ratio=0.0,
    )
    records = generate(spec)
    application = start_continuous("run", registry, ["bronze", "silver", "gold", "offline"])
    try:
        write_landing(records, registry.landing_path, LONG_RUN_DEVICES, rate=LONG_RUN_DEVICES)
        drained(spark, registry, len(records), timeout=1800)
    finally:
        stop_stream(application)
    delays = [seconds for _, seconds in firing_delays(spark, config, registry)]
    batch_costs = {
        f"long_run_{query}_batch_{part}_s": seconds
        for query in ("bronze", "silver", "gold", "offline")
        for part, seconds in early_and_late_batches(registry, query).items()
    }
    if len(delays) < 10 + 2 * LONG_RUN_WINDOWS:
        raise RuntimeError(f"only {len(delays)} windows fired: run the long run for longer")
    early, late = delays[10 : 10 + LONG_RUN_WINDOWS], delays[-LONG_RUN_WINDOWS:]
    blocks = [delays[start : start + LONG_RUN_WINDOWS] for start in range(10, len(delays), LONG_RUN_WINDOWS)]
    return {
        "long_run_seconds": seconds,
        "long_run_fired_windows": len(delays),
        "long_run_early_median_s": round(statistics.median(early), 2),
        "long_run_late_median_s": round(statistics.median(late), 2),
        "long_run_delay_ratio": round(statistics.median(late) / statistics.median(early), 3),
        "long_run_worst_p95_s": round(max(percentile_95(block) for block in blocks), 2),
        **batch_costs,
    }


SUSTAINED_RATES = (1_000, 2_000, 5_000, 10_000, 20_000, 50_000)
SUSTAINED_CARRIED_SHARE = 0.95
SUSTAINED_FIRING_P95_S = 5.0


def sustained_benchmark(
    spark: SparkSession, config: PipelineConfig, seconds: float, work: Path
) -> dict[str, float]:
    results: dict[str, float] = {"sustained_seconds": seconds, "sustained_max_rps": 0}
    for rate in SUSTAINED_RATES:
        registry = TableRegistry(config, str(work / f"sustained-{rate}"))
        records = steady_fleet(500, 19, seconds, rate)
        application = start_continuous("run", registry, ["bronze", "silver", "gold", "offline"])
        try:
            started = time.monotonic()
            write_landing(records, registry.landing_path, rate, rate=rate)
            drained(spark, registry, len(records), timeout=1800)
            carried = len(records) / (time.monotonic() - started)
        finally:
            stop_stream(application)
        p95 = percentile_95(firing_latencies(spark, config, registry))
        results[f"sustained_{rate}_carried_rps"] = round(carried)
        results[f"sustained_{rate}_firing_p95_s"] = round(p95, 2)
        for query in ("bronze", "silver", "gold", "offline"):
            for part, batch_s in early_and_late_batches(registry, query).items():
                results[f"sustained_{rate}_{query}_batch_{part}_s"] = batch_s
        if carried < SUSTAINED_CARRIED_SHARE * rate or p95 > SUSTAINED_FIRING_P95_S:
            break
        results["sustained_max_rps"] = rate
    return results


LOG_HISTORY_LENGTHS = (50, 500, 5_000)
LOG_HISTORY_SAMPLES = 20
LOG_STORES = {"delta": "io.delta.storage.HDFSLogStore", "tidemark": "io.tidemark.fs.LocalLogStore"}


def log_history_benchmark(spark: SparkSession, work: Path) -> dict[str, float]:
    # A throwaway log first, so that the shortest history does not pay the JIT's warm-up.
    log_history_costs(spark, str(work / "log-history-warm-up"), LOG_HISTORY_LENGTHS[:1])
    results = log_history_costs(spark, str(work / "log-history"), LOG_HISTORY_LENGTHS)
    first, last = LOG_HISTORY_LENGTHS[0], LOG_HISTORY_LENGTHS[-1]
    results[f"log_commit_{last}_vs_{first}"] = round(
        results[f"log_commit_ms_{last}"] / results[f"log_commit_ms_{first}"], 3
    )
    return results


def log_history_costs(spark: SparkSession, path: str, lengths: Sequence[int]) -> dict[str, float]:
    """The table at ``path`` grown commit by commit to each of ``lengths``, and timed there."""
    schema = StructType([StructField("n", LongType())])
    properties = dict((LOG_CHECKPOINT_INTERVAL, LOG_RETENTION, REMOVED_FILES_RETENTION))
    Transaction(spark, path).create(schema, [], properties)
    made = itertools.count()

    def commit() -> None:
        n = next(made)
        transaction = Transaction(spark, path)
        transaction.commit_append(transaction.write_rows([(n,)], schema), f"bench-{n}")

    configuration = spark._jsc.hadoopConfiguration()
    stores = {name: java_class(spark, store)(configuration) for name, store in LOG_STORES.items()}
    hadoop_path = java_class(spark, "org.apache.hadoop.fs.Path")

    def listing(store: Any, latest: Any) -> None:
        found = store.listFrom(latest, configuration)
        while found.hasNext():
            found.next()

    def median_ms(action: Callable[[], object]) -> float:
        return round(1000 * statistics.median(timed(action) for _ in range(LOG_HISTORY_SAMPLES)), 2)

    results: dict[str, float] = {}
    for length in lengths:
        while table_version(spark, path) < length:
            commit()
        results[f"log_commit_ms_{length}"] = median_ms(commit)
        results[f"log_version_ms_{length}"] = median_ms(lambda: table_version(spark, path))
        latest = hadoop_path(f"file:{path}/_delta_log/{table_version(spark, path):020d}.")
        for name, store in stores.items():
            timed_listing = functools.partial(listing, store, latest)
            results[f"log_listing_{name}_store_ms_{length}"] = median_ms(timed_listing)
    return results


def early_and_late_batches(registry: TableRegistry, query: str) -> dict[str, float]:
    """The median seconds of a stream's micro-batches in the tenth of its batches
    after its first ten, and in its last tenth: each batch from its offsets' write
    (the batch planned) to its commit's (done), as the query's checkpoint records them."""
    checkpoint = Path(join(registry.root, "_checkpoints", registry.config.name, query))
    durations = []
    for commit in sorted((checkpoint / "commits").glob("[0-9]*"), key=lambda file: int(file.name)):
        offsets = checkpoint / "offsets" / commit.name
        if offsets.exists():
            durations.append(commit.stat().st_mtime - offsets.stat().st_mtime)
    tenth = (len(durations) - 10) // 10
    if tenth < 5:
        return {}
    return {
        "early": round(statistics.median(durations[10 : 10 + tenth]), 2),
        "late": round(statistics.median(durations[-tenth:]), 2),
    }


def percentile_95(values: Sequence[float]) -> float:
    """The 95th percentile of ``values``, the nearest rank below."""
    ordered = sorted(values)
    return ordered[int(0.95 * (len(ordered) - 1))]


SMALL_BATCH_RECORDS = 100
GROWTH_BATCH_RECORDS = 600
GROWTH_HISTORIES = {"small": 4_000, "large": 300_000}


class SilverLakehouse:
    """A telemetry lakehouse in this session fed a generated fleet's records in
    arrival order, a bronze run per landed file, and silver's micro-batches timed
    from its own streaming query's progress (the trigger's whole execution)."""

    def __init__(self, spark: SparkSession, config: PipelineConfig, root: Path, records: Sequence[Generated]):
        self.spark = spark
        self.registry = TableRegistry(config, str(root))
        self.records = records
        self.landed = 0
        checkpoints = join(self.registry.root, "_checkpoints")
        self.contexts = {
            job: JobContext(job, config, self.registry, "available-now", 1_000, join(checkpoints, job))
            for job in ("bronze", "silver")
        }

    def land(self, count: int, as_new_process: bool = False) -> list[float]:
        """Land the next ``count`` records as one file, run bronze, then silver:
        the seconds of each silver micro-batch that had input. ``as_new_process``:
        silver first forgets what a process keeps between runs (its clocks, its
        in-play files, the tables' Delta logs), as the first batch of a new spark-submit must."""
        write_landing(self.records[self.landed : self.landed + count], self.registry.landing_path, count)
        self.landed += count
        bronze.run(self.spark, self.contexts["bronze"])
        if as_new_process:
            forget_clocks()
            forget_partition_writers()
            forget_table_files()
            self.spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
        query = silver.stream(self.spark, self.contexts["silver"]).start()
        query.awaitTermination()
        return [
            progress["durationMs"]["triggerExecution"] / 1000
            for progress in query.recentProgress
            if progress["numInputRows"]
        ]


def silver_cost_benchmark(
    spark: SparkSession, config: PipelineConfig, small_batches: int, growth_batches: int, work: Path
) -> dict[str, float]:
    """What one silver micro-batch costs: of SMALL_BATCH_RECORDS records, warm (the
    median of ``small_batches``); and of GROWTH_BATCH_RECORDS records after a history
    of 300 k events against after 4 k (medians of ``growth_batches`` each, the two
    lakehouses alternated), which the cost rule wants equal."""
    largest = max(GROWTH_HISTORIES.values())
    records = fleet_records(largest + growth_batches * GROWTH_BATCH_RECORDS)
    small = SilverLakehouse(spark, config, work / "silver-small-batches", records)
    small.land(WARM_UP_EVENTS)
    small_seconds = [seconds for _ in range(small_batches) for seconds in small.land(SMALL_BATCH_RECORDS)]
    histories = {}
    for label, events in GROWTH_HISTORIES.items():
        lakehouse = SilverLakehouse(spark, config, work / f"silver-history-{label}", records)
        lakehouse.land(events)
        histories[label] = lakehouse
    growth: dict[tuple[str, bool], list[float]] = {}
    for _ in range(growth_batches):
        for as_new_process in (False, True):
            for label, lakehouse in histories.items():
                seconds = lakehouse.land(GROWTH_BATCH_RECORDS, as_new_process)
                growth.setdefault((label, as_new_process), []).extend(seconds)
    small_s, large_s, small_new_s, large_new_s = (
        statistics.median(growth[label, as_new_process])
        for as_new_process in (False, True)
        for label in GROWTH_HISTORIES
    )
    return {
        "silver_small_batch_records": SMALL_BATCH_RECORDS,
        "silver_small_batches": len(small_seconds),
        "silver_small_batch_s": round(statistics.median(small_seconds), 2),
        "silver_history_events_small": GROWTH_HISTORIES["small"],
        "silver_history_events_large": GROWTH_HISTORIES["large"],
        "silver_after_small_history_s": round(small_s, 2),
        "silver_after_large_history_s": round(large_s, 2),
        "silver_history_growth": round(large_s / small_s, 3),
        "silver_new_process_after_small_history_s": round(small_new_s, 2),
        "silver_new_process_after_large_history_s": round(large_new_s, 2),
        "silver_new_process_history_growth": round(large_new_s / small_new_s, 3),
    }


MERGE_PENDING = 25


def pending_late_ids(lakehouse: Path, pipeline: str) -> set[tuple[str, str]]:
    """(table, event id) of every pending quarantined record and late track."""
    from tidemark_airflow import lakehouse as tables  # the plugin's reader: no Spark beside the demo

    pending = set()
    for name in (f"{pipeline}_late", f"{pipeline}_late_tracks"):
        rows = tables._read(str(lakehouse), "quarantine", name, ["event_id"], "status = 'pending'")
        if rows is not None:
            pending |= {(name, event_id) for event_id in rows.column("event_id").to_pylist()}
    return pending


def merge_beside_live_benchmark(repeats: int, work: Path) -> dict[str, float]:
    """``make demo`` live, then the Watermarks page's merge button pressed (the run it
    triggers) whenever MERGE_PENDING late records (or a few more) wait and no merge run is
    active, ``repeats`` times: the seconds from the press until every record pending
    at the press shows as merged, quarantined record and late track alike, while the
    demo's streams run. The DAG stays unpaused, as in the demo: a scheduled run that
    comes due after a press waits behind the pressed one (one active run a DAG)."""
    from tidemark_airflow import demo
    from tidemark_airflow.standalone import Airflow, stop, wait

    from spark_jobs.servers import free_port

    home, lakehouse, port = work / "demo-airflow", work / "demo-lakehouse", free_port()
    seconds, runs = [], []
    try:
        assert demo.main(["--home", str(home), "--lakehouse", str(lakehouse), "--port", str(port)]) == 0
        airflow = Airflow(home, port)
        runs_path = f"/api/v2/dags/{demo.LATE_MERGE}/dagRuns?state=queued&state=running"

        def ready() -> bool:
            late = f"{demo.PIPELINE}_late"
            waiting = sum(table == late for table, _ in pending_late_ids(lakehouse, demo.PIPELINE))
            return waiting >= MERGE_PENDING and airflow.request("GET", runs_path)["total_entries"] == 0

        for _ in range(repeats):
            wait(ready, 900, f"{MERGE_PENDING} late records to wait, and no merge run", every=2)
            waiting = pending_late_ids(lakehouse, demo.PIPELINE)
            pressed = time.monotonic()
            run_id = airflow.trigger(demo.LATE_MERGE, {"pipeline": demo.PIPELINE})
            wait(
                lambda waiting=waiting: not waiting & pending_late_ids(lakehouse, demo.PIPELINE),
                900,
                "the records pending at the press to show as merged",
                every=0.5,
            )
            seconds.append(time.monotonic() - pressed)
            assert airflow.wait_for_run(demo.LATE_MERGE, run_id) == "success"
            run = airflow.request("GET", f"/api/v2/dags/{demo.LATE_MERGE}/dagRuns/{run_id}")
            started, ended = (datetime.fromisoformat(run[key]) for key in ("start_date", "end_date"))
            runs.append((ended - started).total_seconds())
    finally:
        stop(home)
    rounded = [round(second, 1) for second in seconds]
    print(f"merge beside the live demo: {rounded} s, runs {[round(run, 1) for run in runs]} s")
    return {
        "merge_beside_live_s": round(statistics.median(seconds), 1),
        "merge_beside_live_run_s": round(statistics.median(runs), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--only",
        choices=(
            "throughput",
            "silver",
            "merge",
            "latency",
            "tiny",
            "continuous",
            "merge-live",
            "long-run",
            "sustained",
            "log-history",
            "s3",
            "sessions",
        ),
        help="run one benchmark (default: all)",
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--records-per-file", type=int, default=20_000)
    parser.add_argument(
        "--throughput-repeats", type=int, default=5, help="runs of each contender (median reported)"
    )
    parser.add_argument(
        "--small-batches", type=int, default=20, help="silver micro-batches of 100 records (median reported)"
    )
    parser.add_argument(
        "--growth-batches",
        type=int,
        default=5,
        help="silver micro-batches after each history (median reported)",
    )
    parser.add_argument(
        "--merge-history-windows",
        type=int,
        default=100_000,
        help="silver windows in the 1x late-merge history (10x has ten times as many)",
    )
    parser.add_argument(
        "--merge-repeats", type=int, default=3, help="late merges into each history (median reported)"
    )
    parser.add_argument("--latency-seconds", type=float, default=90, help="how long files land")
    parser.add_argument("--latency-rate", type=float, default=100, help="records landed per second")
    parser.add_argument(
        "--latency-warm-up-seconds",
        type=float,
        default=10,
        help="the warm latency run: the feed's opening seconds land and are judged first (0: no warm run)",
    )
    parser.add_argument("--tiny-repeats", type=int, default=3, help="tiny replays and bare jobs (medians)")
    parser.add_argument("--continuous-seconds", type=float, default=60, help="how long files land")
    parser.add_argument(
        "--continuous-rate",
        type=float,
        default=2_000,
        help="records landed per second (above the pipeline's)",
    )
    parser.add_argument(
        "--merge-live-repeats", type=int, default=3, help="merges pressed beside the live demo (median)"
    )
    parser.add_argument(
        "--long-run-seconds", type=int, default=600, help="how long a file a second lands (long run)"
    )
    parser.add_argument(
        "--sustained-seconds", type=float, default=300, help="how long each rate lands (sustained)"
    )
    parser.add_argument(
        "--s3-repeats", type=int, default=2, help="replays of each size on each store (medians)"
    )
    parser.add_argument("--output", type=Path, default=REPO / "bench-results.json")
    args = parser.parse_args()
    if args.merge_history_windows < MIN_HISTORY_WINDOWS:
        parser.error(f"--merge-history-windows must be at least {MIN_HISTORY_WINDOWS}")
    if args.throughput_repeats < 1:
        parser.error("--throughput-repeats must be at least 1")
    if args.merge_repeats < 1:
        parser.error("--merge-repeats must be at least 1")
    if args.latency_warm_up_seconds < 0:
        parser.error("--latency-warm-up-seconds must not be negative")

    work = Path(tempfile.mkdtemp(prefix="tidemark-bench-"))
    try:
        config = load_pipeline(PIPELINE)
        spark = build_session("tidemark-bench", overrides={"spark.ui.enabled": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        results: dict[str, float | str] = {}
        if args.only in (None, "throughput"):
            results |= throughput_benchmark(
                spark, config, args.events, args.records_per_file, args.throughput_repeats, work
            )
        if args.only in (None, "silver"):
            results |= silver_cost_benchmark(spark, config, args.small_batches, args.growth_batches, work)
        if args.only in (None, "merge"):
            results |= merge_benchmark(spark, config, args.merge_history_windows, args.merge_repeats, work)
        if args.only in (None, "latency"):
            for warm_up_s in dict.fromkeys((0.0, args.latency_warm_up_seconds)):
                results |= latency_benchmark(
                    spark, config, args.latency_seconds, args.latency_rate, work, warm_up_s
                )
        if args.only in (None, "tiny"):
            results |= tiny_replay_benchmark(args.tiny_repeats, work)
        if args.only in (None, "continuous"):
            results |= continuous_benchmark(
                spark, config, args.continuous_seconds, args.continuous_rate, work
            )
        if args.only in (None, "merge-live"):
            results |= merge_beside_live_benchmark(args.merge_live_repeats, work)
        if args.only in (None, "long-run"):
            results |= long_run_benchmark(spark, config, args.long_run_seconds, work)
        if args.only in (None, "sustained"):
            results |= sustained_benchmark(spark, config, args.sustained_seconds, work)
        if args.only in (None, "log-history"):
            results |= log_history_benchmark(spark, work)
        if args.only in (None, "s3"):
            results |= s3_vs_local_benchmark(spark, args.s3_repeats, work)
        if args.only in (None, "sessions"):
            results |= sessions_benchmark(args.events, args.records_per_file, spark, work)
        # One benchmark alone keeps the other's figures from the last run.
        kept = json.loads(args.output.read_text()) if args.only and args.output.exists() else {}
        args.output.write_text(json.dumps(kept | results, indent=2) + "\n")
        width = max(map(len, results))
        for name, value in results.items():
            print(f"{name:<{width}}  {value}")
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
