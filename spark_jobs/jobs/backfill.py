"""Backfills: a static input file cut into micro-batches, landed one file per
micro-batch and ingested by the real bronze job one file per trigger (so each
micro-batch is one bronze commit), with what a bounded source reports; then silver
(``tidemark replay``), or nothing more (``tidemark tune --input``)."""

from __future__ import annotations

import csv
import io
import itertools
import json
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from pyspark.sql import SparkSession

from spark_jobs.config import ConfigError, PipelineConfig
from spark_jobs.engine import watermark_steps
from spark_jobs.generator import land_files
from spark_jobs.jobs import bronze, silver
from spark_jobs.jobs.common import JobContext, default_checkpoint, run_streams
from spark_jobs.jobs.stages import DOWNSTREAM, stage_streams
from spark_jobs.sources.progress import PartitionOffsets, SourceProgress, partition_order
from spark_jobs.tables import TableRegistry, join


def batches_by_size(records: Sequence[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(records), size):
        yield list(records[start : start + size])


def batches_by_column(records: Sequence[str], values: Sequence[object]) -> Iterator[list[str]]:
    """Consecutive records with the same value form one batch."""
    batch: list[str] = []
    current: object = object()
    for record, value in zip(records, values, strict=True):
        if batch and value != current:
            yield batch
            batch = []
        batch.append(record)
        current = value
    if batch:
        yield batch


def column_values(records: Sequence[str], column: str, file_format: str, header: str | None) -> list[object]:
    """The value of ``column`` in each record; a malformed record takes its
    predecessor's value (it stays in the batch it arrived in)."""
    values: list[object] = []
    previous: object = None
    names = next(csv.reader([header])) if header is not None else []
    if file_format == "csv" and column not in names:
        raise ConfigError("--batch-column", f"{column!r} is not a column of the input header {names}")
    found = False
    for record in records:
        try:
            if file_format == "csv":
                row = next(csv.reader(io.StringIO(record)))
                value = row[names.index(column)]
            else:
                value = json.loads(record)[column]
            found = True
        except (ValueError, KeyError, IndexError, TypeError, StopIteration):
            value = previous
        values.append(value)
        previous = value
    if records and not found:
        raise ConfigError("--batch-column", f"no input record has a {column!r} field")
    return values


def read_input(path: Path, file_format: str) -> tuple[str | None, list[str]]:
    """(CSV header or None, records) in file order; a trailing newline adds nothing."""
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except OSError as error:
        raise ConfigError("--input", f"cannot read {path}: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(
            "--input", f"{path} is not UTF-8 text ({error.reason} at byte {error.start})"
        ) from None
    if lines and lines[-1] == "":
        lines.pop()
    if file_format == "csv":
        if not lines:
            raise ConfigError("--input", f"{path} is empty: a CSV input needs its header line")
        return lines[0], lines[1:]
    return None, lines


def require_partitions(config: PipelineConfig) -> None:
    if config.partition_column is None:
        raise ConfigError("partition_column", "a replay takes partitions from partition_column; set it")


def replay_config(config: PipelineConfig, landing: str) -> PipelineConfig:
    """The pipeline with its source swapped for the replay's landing folder, one
    file (one micro-batch) per bronze trigger."""
    require_partitions(config)
    source = replace(config.source, kind="files", path=landing, max_files_per_trigger=1)
    return replace(config, source=source)


def cut_batches(
    config: PipelineConfig, input_path: Path, batch_size: int | None, batch_column: str | None
) -> Iterable[list[str]]:
    """The input's micro-batches, each a landing file's lines. Reads and checks the
    whole input (raising ConfigError) before it returns: nothing is written yet."""
    if batch_size is not None and batch_size < 1:
        raise ConfigError("--batch-size", f"must be at least 1; got {batch_size}")
    file_format = config.source.format
    header, records = read_input(input_path, file_format)
    if batch_column is not None:
        batches: Iterable[list[str]] = batches_by_column(
            records, column_values(records, batch_column, file_format, header)
        )
    else:
        batches = batches_by_size(records, batch_size or 1_000)
    if header is not None:
        batches = ([header, *batch] for batch in batches)
    return batches


def bounded_reports(config: PipelineConfig, batches: Sequence[list[str]]) -> list[SourceProgress]:
    """What a replay's source reports with each batch. Its input is bounded and known
    up front, like a Kafka topic that already holds every record: every partition of
    the input (and of ``source.partitions``), how many of its records bronze has
    consumed through the batch (``end``) and how many the input holds (``latest``)."""
    header = batches[0][0] if batches and config.source.format == "csv" else None
    records = [batch[1:] if header is not None else batch for batch in batches]
    try:
        partitions = column_values(
            [record for batch in records for record in batch],
            config.partition_column,
            config.source.format,
            header,
        )
    except ConfigError:  # no record names a partition: bronze rejects them all
        partitions = [None] * sum(len(batch) for batch in records)
    totals = Counter(str(partition) for partition in partitions if partition is not None)
    consumed: Counter[str] = Counter()
    reports = []
    cursor = iter(partitions)
    for batch in records:
        consumed.update(str(p) for p in itertools.islice(cursor, len(batch)) if p is not None)
        known = sorted({*config.source.partitions, *totals}, key=partition_order)
        reports.append(
            SourceProgress(
                {
                    p: PartitionOffsets(consumed[p], totals[p]) if p in totals else PartitionOffsets()
                    for p in known
                }
            )
        )
    return reports


def replay_batches(
    spark: SparkSession,
    config: PipelineConfig,
    batches: Iterable[list[str]],
    root: str | None = None,
    flush: bool = False,
    silver_every_batch: bool = False,
) -> int:
    """Land the batches (cut by :func:`cut_batches`), then run bronze, silver, gold
    and offline detection (available-now) in ``spark``.

    By default bronze takes every batch before silver starts. ``silver_every_batch``
    runs silver after each bronze batch instead, as a live stream that keeps up
    does: silver then learns of the input still to come only from what the source
    reports (its lag), never from bronze."""
    batches = list(batches)
    registry = TableRegistry(config, root)
    replayed = TableRegistry(replay_config(config, landing_of(registry)), registry.root)
    steps = [range(i, i + 1) for i in range(len(batches))] if silver_every_batch else [range(len(batches))]
    reports = bounded_reports(config, batches)
    silver_checkpoint = default_checkpoint(replayed, "silver")
    for step in steps:
        code = ingest(spark, replayed, batches, reports, step)
        if code != 0:
            return code
        silver_context = JobContext(
            "silver", replayed.config, replayed, "available-now", 1_000, silver_checkpoint
        )
        code = silver.run(spark, silver_context)
        if code != 0:
            return code
    if flush:
        watermark_steps.flush(spark, registry, after_stream=silver_checkpoint)
    downstream = JobContext(
        "replay", config, registry, "available-now", 1_000, "unused: each job has its own"
    )
    return run_streams(stage_streams(spark, downstream, DOWNSTREAM))


def ingest_batches(
    spark: SparkSession, config: PipelineConfig, batches: Sequence[list[str]], root: str
) -> int:
    """Land the batches and ingest them into bronze only, as a replay does before its
    silver pass."""
    registry = TableRegistry(config, root)
    replayed = TableRegistry(replay_config(config, landing_of(registry)), registry.root)
    return ingest(spark, replayed, batches, bounded_reports(config, batches), range(len(batches)))


def landing_of(registry: TableRegistry) -> str:
    return join(registry.root, "_replay", registry.config.name)


def ingest(
    spark: SparkSession,
    replayed: TableRegistry,
    batches: Sequence[list[str]],
    reports: Sequence[SourceProgress],
    step: range,
) -> int:
    """Land ``step``'s batches and run bronze over them, one file per trigger, each
    trigger reporting what the bounded source does."""
    config = replayed.config
    land_files([batches[i] for i in step], str(config.source.path), config.source.format, prefix="replay")
    checkpoint = join(replayed.root, "_checkpoints", config.name, "replay-bronze")
    context = JobContext("bronze", config, replayed, "available-now", 1_000, checkpoint)
    context.reported_progress = lambda index, first=step.start: reports[first + index]
    return bronze.run(spark, context)
