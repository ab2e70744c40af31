"""``tidemark merge-late``: fold pending quarantined late records into silver and gold
(:mod:`spark_jobs.engine.late_merge`), and the run in ``ops.runs``. While the
pipeline's application runs, it merges sooner, warm (:mod:`spark_jobs.engine.merge_requests`)."""

from __future__ import annotations

import argparse
import os
import sys

from spark_jobs.arguments import with_examples
from spark_jobs.config import PIPELINE_HELP, ConfigError, load_pipeline
from spark_jobs.engine.late_merge import TimeRange, dry_run, logged_merge
from spark_jobs.engine.merge_requests import MergeRequest, ask, requests_folder
from spark_jobs.jobs.common import exit_with_named_errors, folder_argument
from spark_jobs.session import build_session
from spark_jobs.tables import TableRegistry, join

# How long a merge the pipeline application took may take before the requester merges itself.
SERVED_WITHIN_S = 900.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tidemark merge-late",
        description="Fold pending quarantined late records into their silver windows and gold.",
    )
    with_examples(
        parser,
        "tidemark merge-late --pipeline telemetry --dry-run",
        "tidemark merge-late --pipeline telemetry --from 2026-01-01 --to 2026-01-02",
    )
    parser.add_argument("--pipeline", required=True, help=PIPELINE_HELP)
    parser.add_argument("--lakehouse", help="lakehouse root (default: $LAKEHOUSE_DIR or ./lakehouse)")
    parser.add_argument("--dry-run", action="store_true", help="print what would change; write nothing")
    parser.add_argument("--from", dest="start", help="only windows starting at or after this ISO-8601 time")
    parser.add_argument("--to", dest="end", help="only windows starting before this ISO-8601 time")
    parser.add_argument(
        "--here",
        action="store_true",
        help="merge in this process even while the pipeline's application runs and could merge sooner",
    )
    return parser


@exit_with_named_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    window = TimeRange.parsed(args.start, args.end)
    config = load_pipeline(args.pipeline)
    registry = TableRegistry(config, folder_argument(args.lakehouse, "--lakehouse"))
    local = "://" not in registry.root
    if local and not os.path.isdir(registry.root):
        raise ConfigError("--lakehouse", f"no lakehouse at {registry.root}")
    if local and not os.path.isdir(join(registry.quarantine.path, "_delta_log")):
        # Silver has not run yet (a scheduled merge may come first): nothing is late.
        print(f"tidemark merge-late: no quarantine table at {registry.quarantine.path} yet; nothing to merge")
        return 0
    folder = requests_folder(registry.root, config.name)
    if not (args.dry_run or args.here or folder is None):
        served = ask(folder, MergeRequest(args.start, args.end), SERVED_WITHIN_S)
        if served is not None:
            print(f"tidemark merge-late: the pipeline application merged: {served.message}")
            return 0 if served.succeeded else 1
    spark = build_session(f"tidemark-merge-late-{config.name}")
    if args.dry_run:
        dry_run(spark, registry, window)
        return 0
    print(f"tidemark merge-late: {logged_merge(spark, registry, window)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
