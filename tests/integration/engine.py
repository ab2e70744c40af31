"""Driving the real silver engine through `replay` and reading its tables back in
the reference model's terms, so tests can compare the two exactly."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from spark_jobs.config import PipelineConfig, parse_pipeline
from spark_jobs.eventtime import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    Batch,
    ModelResult,
    OfflineDetector,
    Record,
    ReferenceSessions,
    SessionSpec,
    run_reference,
)
from spark_jobs.eventtime.sessions import SessionModelResult
from spark_jobs.jobs import bronze, gold, offline, silver
from spark_jobs.jobs.common import JobContext
from spark_jobs.jobs.replay import replay
from spark_jobs.tables import TableRegistry, join

BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
# The offline tests' pipeline: 1-minute tumbling windows, a 5 s bound, a 30-minute timeout per device.
BOUNDED = {"strategy": "bounded", "max_out_of_orderness": "5s"}
TUMBLING = {"type": "tumbling", "size": "1m", "offset": "0s"}
OFFLINE = {"timeout": "30m", "key": ["device_id"]}
_names = itertools.count()

MEASURES = {"battery": ["avg", "min", "sum"], "speed": ["max", "count", "approx_distinct"]}
SCHEMA = {
    "device_id": "string",
    "ts": "long",
    "region": "string",
    "battery": "double",
    "speed": "double",
    "partition": "int",
    "marker": "string",  # set only on punctuated markers
}


def engine_config(
    window: dict,
    watermark: dict,
    allowed_lateness: str = "0s",
    time_characteristic: str = "event",
    offline: dict | None = None,
    partitions: Sequence[int] = (),
    gold: dict | None = None,
) -> PipelineConfig:
    """A pipeline with a fresh name, so many runs share one lakehouse."""
    return parse_pipeline(
        engine_document(window, watermark, allowed_lateness, time_characteristic, offline, partitions, gold)
    )


def engine_document(
    window: dict,
    watermark: dict,
    allowed_lateness: str = "0s",
    time_characteristic: str = "event",
    offline: dict | None = None,
    partitions: Sequence[int] = (),
    gold: dict | None = None,
) -> dict:
    """The pipeline file's content, for jobs started by spark-submit; ``partitions``
    are declared up front (``source.partitions``)."""
    source = {"kind": "files", "path": "unused", "format": "json"}
    return {
        "pipeline": f"engine_{next(_names)}",
        "source": {**source, "partitions": list(partitions)} if partitions else source,
        "schema": SCHEMA,
        "event_time": {"column": "ts", "format": "epoch_millis", "max_future_skew": "3650d"},
        "time_characteristic": time_characteristic,
        "partition_column": "partition",
        "key": ["region", "device_id"],
        "watermark": watermark,
        "window": window,
        "allowed_lateness": allowed_lateness,
        "measures": MEASURES,
        "offline": offline,
        "gold": gold,
    }


def payload(partition: int, ts_ms: int, device: str, battery: float, speed: float) -> dict:
    return {
        "device_id": device,
        "ts": ts_ms,
        "region": "r1",
        "battery": battery,
        "speed": speed,
        "partition": partition,
    }


def replay_batches(
    spark,
    config: PipelineConfig,
    root: Path,
    batches: Sequence[Sequence[dict]],
    flush: bool = False,
    silver_every_batch: bool = False,
) -> TableRegistry:
    """Replay ``batches`` (lists of payloads) cut by the ``batch`` column."""
    lines = [
        json.dumps({**record, "batch": index}) for index, batch in enumerate(batches) for record in batch
    ]
    path = root / f"{config.name}.json"
    path.write_text("\n".join(lines) + "\n")
    code = replay(
        spark,
        config,
        path,
        str(root),
        batch_column="batch",
        flush=flush,
        silver_every_batch=silver_every_batch,
    )
    assert code == 0
    return TableRegistry(config, str(root))


BATCH_INTERVAL_MS = 1_000


def model_of(
    config: PipelineConfig, batches: Sequence[Sequence[dict]], flush: bool = False, column: str = "ts"
) -> ModelResult | SessionModelResult:
    """What the model makes of a replay (:func:`model_batches`)."""
    if isinstance(config.window, SessionSpec):
        return ReferenceSessions(config.rules()).run(model_batches(config, batches, column), flush=flush)
    return run_reference(config.rules(), model_batches(config, batches, column), flush=flush)


def model_batches(
    config: PipelineConfig, batches: Sequence[Sequence[dict]], column: str = "ts"
) -> list[Batch]:
    """A replay's batches as the model takes them. The replay's source is bounded and
    known up front: it reports every partition of the input (and the declared ones)
    from the first batch on, and a partition with records in a later batch has unread
    input (backlog, whether silver learns it from bronze or from the source's lag).
    Batches are a second apart in processing time: the engine's are at least a
    millisecond apart, so an idleness of a millisecond decides alike in both."""
    marker = config.watermark.marker_column
    everywhere = frozenset(
        {*config.source.partitions, *(str(r["partition"]) for batch in batches for r in batch)}
    )
    return [
        Batch(
            [Record(str(r["partition"]), r[column], r, marker is not None and marker in r) for r in batch],
            processing_time=index * BATCH_INTERVAL_MS,
            backlog=frozenset(str(r["partition"]) for later in batches[index + 1 :] for r in later),
            partitions=everywhere if index == 0 else frozenset(),
        )
        for index, batch in enumerate(batches)
    ]


def read(spark, table) -> list:
    return spark.read.format("delta").load(table.path).collect()


def engine_windows(spark, registry: TableRegistry) -> dict:
    """(key, (start_ms, end_ms)) -> (record_count, measures, revision, status)."""
    config = registry.config
    frame = (
        spark.read.format("delta")
        .load(registry.silver.path)
        .selectExpr(
            "unix_millis(window_start) AS start_ms",
            "unix_millis(window_end) AS end_ms",
            *config.key,
            "record_count",
            *config.measure_columns,
            "revision",
            "status",
        )
    )
    return {
        (tuple(row[k] for k in config.key), (row.start_ms, row.end_ms)): (
            row.record_count,
            {m: row[m] for m in config.measure_columns},
            row.revision,
            row.status,
        )
        for row in frame.collect()
    }


def rounded(windows: dict) -> dict:
    """Sums of doubles depend on the order they are added in; compare them to 1e-9."""

    def approx(value):
        return round(value, 9) if isinstance(value, float) else value

    return {
        slot: (count, {name: approx(value) for name, value in measures.items()}, revision, status)
        for slot, (count, measures, revision, status) in windows.items()
    }


def model_windows(config: PipelineConfig, result: ModelResult) -> dict:
    return {
        (key, (window.start, window.end)): (w.record_count, w.measures, w.revision, w.status)
        for (key, window), w in result.windows.items()
    }


def engine_quarantine(spark, registry: TableRegistry) -> Counter:
    """Multiset of (partition, ts, device, window start, window end, watermark, lateness)."""
    frame = (
        spark.read.format("delta")
        .load(registry.quarantine.path)
        .selectExpr(
            "source_partition",
            "ts",
            "device_id",
            "unix_millis(window_start) AS start_ms",
            "unix_millis(window_end) AS end_ms",
            "watermark",
            "lateness_ms",
        )
    )
    return Counter(tuple(row) for row in frame.collect())


def model_quarantine(result: ModelResult) -> Counter:
    return Counter(
        (
            pair.record.partition,
            pair.record.payload["ts"],
            pair.record.payload["device_id"],
            pair.window.start,
            pair.window.end,
            pair.watermark,
            pair.lateness_ms,
        )
        for pair in result.quarantined
    )


def engine_history(spark, registry: TableRegistry) -> list[tuple]:
    """(watermark, active, idle, on_time, late) per batch, in batch order."""
    frame = (
        spark.read.format("delta")
        .load(registry.ops["watermark_history"].path)
        .where(f"pipeline = '{registry.config.name}'")
        .orderBy("batch_id")
    )
    return [
        (r.watermark, r.active_partitions, r.idle_partitions, r.on_time_count, r.late_count)
        for r in frame.collect()
    ]


def model_history(result: ModelResult) -> list[tuple]:
    return [
        (h.watermark, h.active_partitions, h.idle_partitions, h.on_time_count, h.late_count)
        for h in result.history
    ]


def window_pairs_of(config: PipelineConfig, records: Sequence[dict], column: str = "ts") -> int:
    """How many (record, window) pairs the input's data records hold: the
    reconciliation total (punctuated markers are not data)."""
    marker = config.watermark.marker_column
    data = [record for record in records if marker is None or marker not in record]
    return sum(len(config.window.assign(record[column])) for record in data)


def assert_reconciles(spark, registry: TableRegistry, records: Sequence[dict], column: str = "ts") -> None:
    """Every (bronze record, window) pair counted exactly once: in a silver window's
    record_count or as a quarantine row. Input = bronze here (no rejects); windows
    run on ``column`` (the time characteristic's millis)."""
    bronze = spark.read.format("delta").load(registry.bronze.path).count()
    assert bronze == len(records)
    silver = spark.read.format("delta").load(registry.silver.path).groupBy().sum("record_count").first()[0]
    quarantined = spark.read.format("delta").load(registry.quarantine.path).count()
    assert (silver or 0) + quarantined == window_pairs_of(registry.config, records, column)


def batch_computation(tracks: Sequence[tuple[str, int]], timeout_ms: int) -> list[tuple]:
    """Offline detection over all (key, event time) tracks at once with the input
    ended: the status events every replay and every live run must give."""
    events, late = OfflineDetector(timeout_ms).process_batch(list(tracks), MIN_WATERMARK, MAX_WATERMARK)
    assert late == []
    return sorted((e.key, e.status, e.event_time) for e in events)


JOBS = {"bronze": bronze, "silver": silver, "gold": gold, "offline": offline}


def run_jobs(spark, registry: TableRegistry, *jobs: str) -> None:
    """Run streaming jobs available-now in this session, each on its usual checkpoint."""
    for job in jobs:
        assert run_job_once(spark, registry, job) == 0, job


def run_job_once(spark, registry: TableRegistry, job: str) -> int:
    """One available-now run of a streaming job in this session: its exit code."""
    checkpoint = join(registry.root, "_checkpoints", registry.config.name, job)
    context = JobContext(job, registry.config, registry, "available-now", 1_000, checkpoint)
    return JOBS[job].run(spark, context)


def assert_engine_equals_model(
    spark, config: PipelineConfig, registry: TableRegistry, batches: Sequence[Sequence[dict]], flush: bool
) -> None:
    """Silver's windows, quarantine and watermark history are the model's, exactly,
    and every pair is counted once."""
    expected = model_of(config, batches, flush=flush)
    assert engine_windows(spark, registry) == model_windows(config, expected)
    assert engine_quarantine(spark, registry) == model_quarantine(expected)
    assert engine_history(spark, registry) == model_history(expected)
    assert_reconciles(spark, registry, [record for batch in batches for record in batch])


def jobs_run(spark, action) -> int:
    """How many Spark jobs ``action`` ran (a group of its own: the status tracker keeps a group's jobs)."""
    group = f"tidemark-counted-{next(_names)}"
    spark.sparkContext.setJobGroup(group, "counted")
    try:
        action()
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))
