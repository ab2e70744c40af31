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
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from spark_jobs.arguments import with_examples
from spark_jobs.config import PIPELINE_HELP, PipelineConfig, load_pipeline
from spark_jobs.jobs.backfill import cut_batches, replay_batches, require_partitions
from spark_jobs.jobs.common import exit_with_named_errors, folder_argument
from spark_jobs.session import session_for_records


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


@exit_with_named_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = load_pipeline(args.pipeline)
    require_partitions(config)
    lakehouse = folder_argument(args.lakehouse, "--lakehouse")
    # The whole input is read and checked first: a bad one starts no Spark and lands nothing.
    batches = list(cut_batches(config, args.input, args.batch_size, args.batch_column))
    spark = session_for_records(f"tidemark-replay-{config.name}", sum(map(len, batches)))
    return replay_batches(spark, config, batches, lakehouse, args.flush)


if __name__ == "__main__":
    sys.exit(main())
