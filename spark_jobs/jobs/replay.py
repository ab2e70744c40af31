"""``tidemark replay``: run the real bronze, silver, gold and offline jobs over a static file.

The input (JSON lines or CSV, in the pipeline's format) is read in file order
and cut into micro-batches: every ``--batch-size`` records, or wherever the
value of ``--batch-column`` changes. Each micro-batch is landed as one file
(strictly increasing modification times) in ``<lakehouse>/_replay/<pipeline>``;
bronze then takes exactly one file per trigger, so each micro-batch becomes one
bronze commit, which is the unit silver judges and advances the watermark by.
Partitions come from the pipeline's ``partition_column``. ``--flush`` ends the
input like a bounded source: the watermark moves to +inf after the last batch.
Gold and offline detection (when the pipeline has them) run last, over
everything silver fired and every watermark step it took.

This is how users backfill and try watermark settings on history, and how the
tests drive the engine.
"""

from __future__ import annotations

import argparse
import csv
import io
import itertools
import json
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from pyspark.sql import SparkSession

from spark_jobs.arguments import with_examples
from spark_jobs.config import PIPELINE_HELP, ConfigError, PipelineConfig, load_pipeline
from spark_jobs.engine import watermark_steps
from spark_jobs.generator import land_files
from spark_jobs.jobs import bronze, gold, offline, silver
from spark_jobs.jobs.common import JobContext, exit_on_config_error, folder_argument
from spark_jobs.session import build_session
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


def replay(
    spark: SparkSession,
    config: PipelineConfig,
    input_path: Path,
    root: str | None = None,
    batch_size: int | None = None,
    batch_column: str | None = None,
    flush: bool = False,
    silver_every_batch: bool = False,
) -> int:
    """Land the input, then run bronze, silver, gold and offline detection
    (available-now) in ``spark``."""
    require_partitions(config)
    batches = cut_batches(config, input_path, batch_size, batch_column)
    return replay_batches(spark, config, batches, root, flush, silver_every_batch)


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
    """:func:`replay` of batches already cut by :func:`cut_batches`.

    By default bronze takes every batch before silver starts. ``silver_every_batch``
    runs silver after each bronze batch instead, as a live stream that keeps up
    does: silver then learns of the input still to come only from what the source
    reports (its lag), never from bronze."""
    batches = list(batches)
    reports = bounded_reports(config, batches)
    registry = TableRegistry(config, root)
    landing = join(registry.root, "_replay", config.name)
    replayed = TableRegistry(replay_config(config, landing), registry.root)
    checkpoints = join(registry.root, "_checkpoints", config.name)
    steps = [range(i, i + 1) for i in range(len(batches))] if silver_every_batch else [range(len(batches))]
    for step in steps:
        land_files([batches[i] for i in step], landing, config.source.format, prefix="replay")
        for job, module, checkpoint in (
            ("bronze", bronze, join(checkpoints, "replay-bronze")),
            ("silver", silver, join(checkpoints, "silver")),
        ):
            context = JobContext(job, replayed.config, replayed, "available-now", 1_000, checkpoint)
            if job == "bronze":
                context.reported_progress = lambda index, first=step.start: reports[first + index]
            code = module.run(spark, context)
            if code != 0:
                return code
    if flush:
        watermark_steps.flush(spark, registry)
    downstream = [("gold", gold)] if registry.gold is not None else []
    if config.offline is not None:
        downstream.append(("offline", offline))
    for job, module in downstream:
        code = module.run(
            spark, JobContext(job, config, registry, "available-now", 1_000, join(checkpoints, job))
        )
        if code != 0:
            return code
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tidemark replay",
        description="Replay a static JSON-lines or CSV file through bronze and silver, "
        "in file order, with controlled micro-batches.",
    )
    with_examples(
        parser,
        "tidemark replay --pipeline telemetry --input history.json --flush",
        "tidemark replay --pipeline telemetry --input history.json --batch-size 500",
    )
    parser.add_argument("--pipeline", required=True, help=PIPELINE_HELP)
    parser.add_argument("--input", required=True, type=Path, help="input file in the pipeline's format")
    parser.add_argument("--lakehouse", help="lakehouse root (default: $LAKEHOUSE_DIR or ./lakehouse)")
    cut = parser.add_mutually_exclusive_group()
    cut.add_argument("--batch-size", type=int, help="records per micro-batch (default: 1000)")
    cut.add_argument("--batch-column", help="a new micro-batch wherever this column's value changes")
    parser.add_argument("--flush", action="store_true", help="end of input: the watermark moves to +inf")
    return parser


@exit_on_config_error
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = load_pipeline(args.pipeline)
    require_partitions(config)
    lakehouse = folder_argument(args.lakehouse, "--lakehouse")
    # The whole input is read and checked first: a bad one starts no Spark and lands nothing.
    batches = cut_batches(config, args.input, args.batch_size, args.batch_column)
    spark = build_session(f"tidemark-replay-{config.name}")
    return replay_batches(spark, config, batches, lakehouse, args.flush)


if __name__ == "__main__":
    sys.exit(main())
