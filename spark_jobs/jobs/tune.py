"""``tidemark tune``: for candidate watermark settings, exactly what silver would do
over the same history (DESIGN §2b), from one pass over bronze instead of a replay
per candidate: the pairs lost as late, the windows that re-fire, and how long after
a window's end it first fired. The history is the pipeline's bronze table
(``--bronze``) or an input file (``--input``), ingested into a scratch lakehouse by
the real bronze job, cut into micro-batches as ``tidemark replay`` cuts them. The
scratch lakehouse is under the lakehouse root (``_scratch/``), which every executor
of a cluster reaches, as it does the root, and is deleted afterwards."""

from __future__ import annotations

import argparse
import sys
import uuid
from dataclasses import replace
from pathlib import Path

from spark_jobs.arguments import with_examples
from spark_jobs.config import PIPELINE_HELP, ConfigError, PipelineConfig, load_pipeline, parse_duration
from spark_jobs.engine.session_tuning import tune_sessions
from spark_jobs.engine.tuning import CANDIDATE_HELP, Candidate, CannotTune, parse_candidate, tune
from spark_jobs.engine.tuning_report import as_json, chart_svg, save, table
from spark_jobs.eventtime.generators import GeneratorError
from spark_jobs.eventtime.windows import SessionSpec
from spark_jobs.jobs.backfill import cut_batches, ingest_batches, require_partitions
from spark_jobs.jobs.common import exit_with_named_errors, folder_argument
from spark_jobs.lakehouse.files import delete_tree
from spark_jobs.session import build_session, session_for_records
from spark_jobs.tables import TableRegistry, join, lakehouse_root


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tidemark tune",
        description="What silver would do under candidate watermark settings (and session "
        "gaps), over the pipeline's bronze history or an input file: late pairs or records, "
        "re-fires, firing delays, sessions split and merged.",
    )
    with_examples(
        parser,
        "tidemark tune --pipeline telemetry --bronze --save --candidates 2s 5s 30s 5s+2m",
        "tidemark tune --pipeline telemetry --input history.json --flush --chart tradeoff.svg "
        "--candidates 5s 'spark_jobs.eventtime.adaptive:AdaptiveBound(floor=2s,ceiling=1m)'",
        "tidemark tune --pipeline rides --bronze --candidates 30s 30s+10m --gaps 2m 5m 10m",
    )
    parser.add_argument("--pipeline", required=True, help=PIPELINE_HELP)
    history = parser.add_mutually_exclusive_group(required=True)
    history.add_argument("--bronze", action="store_true", help="the pipeline's bronze table in the lakehouse")
    history.add_argument("--input", type=Path, help="an input file in the pipeline's format")
    parser.add_argument(
        "--lakehouse", help="lakehouse root, for --bronze (default: $LAKEHOUSE_DIR or ./lakehouse)"
    )
    cut = parser.add_mutually_exclusive_group()
    cut.add_argument("--batch-size", type=int, help="with --input: records per micro-batch (default: 1000)")
    cut.add_argument(
        "--batch-column", help="with --input: a new micro-batch wherever this column's value changes"
    )
    parser.add_argument("--candidates", nargs="+", required=True, help=f"each {CANDIDATE_HELP}")
    parser.add_argument(
        "--gaps",
        nargs="+",
        help="a session pipeline's gaps to try, each with every candidate (default: the pipeline's)",
    )
    parser.add_argument(
        "--flush", action="store_true", help="end of input after the history: every window fires"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--chart", type=Path, help="write the trade-off chart (SVG) to this file")
    parser.add_argument(
        "--save",
        action="store_true",
        help="keep the figures in the lakehouse's ops.tuning (the page charts them)",
    )
    return parser


@exit_with_named_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = load_pipeline(args.pipeline)
    candidates = with_gaps([parse_candidate(text, config) for text in args.candidates], args.gaps, config)
    sessions = isinstance(config.window, SessionSpec)
    for given, flag in ((args.batch_size, "--batch-size"), (args.batch_column, "--batch-column")):
        if args.bronze and given is not None:
            raise ConfigError(flag, "cuts an --input file; --bronze has its own micro-batches")
    lakehouse = folder_argument(args.lakehouse, "--lakehouse")
    batches = None
    if args.input is not None:
        require_partitions(config)
        # The whole input is read and checked first: a bad one starts no Spark.
        batches = list(cut_batches(config, args.input, args.batch_size, args.batch_column))
    name = f"tidemark-tune-{config.name}"
    # Tuning over bronze reads a history of unknown size: the defaults.
    spark = build_session(name) if batches is None else session_for_records(name, sum(map(len, batches)))
    scratch = join(lakehouse_root(lakehouse), "_scratch", f"tune-{uuid.uuid4().hex}")
    try:
        if batches is not None:
            code = ingest_batches(spark, config, batches, scratch)
            if code != 0:
                return code
        registry = TableRegistry(config, scratch if batches is not None else lakehouse)
        try:
            tuning = (tune_sessions if sessions else tune)(spark, registry, candidates, args.flush)
        except (CannotTune, GeneratorError) as error:
            print(f"tidemark tune: error: {error}", file=sys.stderr)
            return 1
    finally:
        if batches is not None:
            delete_tree(spark, scratch)
    print(as_json(tuning.outcomes) if args.json else table(tuning.outcomes, sessions))
    if args.save:
        history = "bronze" if batches is None else f"input {args.input}"
        save(spark, lakehouse, config.name, tuning.outcomes, history)
    if args.chart is not None:
        late = "records" if sessions else "pairs"
        args.chart.write_text(
            chart_svg(tuning.outcomes, f"{config.name}: late {late} against firing delay", late)
        )
    return 0


def with_gaps(candidates: list[Candidate], gaps: list[str] | None, config: PipelineConfig) -> list[Candidate]:
    """Every candidate with every gap of ``--gaps`` (none given: the candidates as they are)."""
    if gaps is None:
        return candidates
    window = config.window
    if not isinstance(window, SessionSpec):
        raise ConfigError("--gaps", "tries session gaps; this pipeline's windows are not sessions")
    if window.gap_column is not None:
        raise ConfigError(
            "--gaps", f"this pipeline's gaps come from its records (window.gap_column {window.gap_column!r})"
        )
    parsed = {gap: parse_duration(gap, f"--gaps {gap!r}", allow_zero=False) for gap in gaps}
    return [
        replace(candidate, label=f"{candidate.label} gap {gap}", gap_ms=ms)
        for candidate in candidates
        for gap, ms in parsed.items()
    ]


if __name__ == "__main__":
    sys.exit(main())
