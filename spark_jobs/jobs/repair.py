"""``tidemark repair``: remove the last commit file of a table, and the last file of a
stream's checkpoint log, that a crash of the machine left incomplete, where that is safe
(DESIGN §6: nothing lost, nothing doubled), so that the jobs can start again. A file
whose removal could lose or double records is left, and the command says why and fails."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial

from spark_jobs.arguments import with_examples
from spark_jobs.config import PIPELINE_HELP, load_pipeline
from spark_jobs.jobs.common import default_checkpoint, exit_with_named_errors, folder_argument
from spark_jobs.lakehouse.checkpoints import UnsafeRepair, is_checkpoint, repair_checkpoint
from spark_jobs.lakehouse.commit_files import damaged_commits, repair_commit
from spark_jobs.lakehouse.log import has_commits
from spark_jobs.session import build_session
from spark_jobs.tables import TableRegistry

STREAMS = ("bronze", "silver", "gold", "offline")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tidemark repair",
        description="Remove the incomplete last commit file of a pipeline's tables and the "
        "incomplete last file of its stream checkpoints (offsets/, commits/), where that loses "
        "and doubles nothing.",
    )
    with_examples(
        parser, "tidemark repair --pipeline telemetry", "tidemark repair --pipeline telemetry --job silver"
    )
    parser.add_argument("--pipeline", required=True, help=PIPELINE_HELP)
    parser.add_argument("--lakehouse", help="lakehouse root (default: $LAKEHOUSE_DIR or ./lakehouse)")
    parser.add_argument("--job", choices=STREAMS, help="one stream's checkpoint (default: every stream's)")
    return parser


@exit_with_named_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = load_pipeline(args.pipeline)
    registry = TableRegistry(config, folder_argument(args.lakehouse, "--lakehouse"))
    spark = build_session(f"tidemark-repair-{config.name}")
    tables = [table.path for table in registry.all() if has_commits(spark, table.path)]
    checkpoints = {job: default_checkpoint(registry, job) for job in STREAMS}
    checkpoints = {job: path for job, path in checkpoints.items() if is_checkpoint(spark, path)}
    # The tables first: a checkpoint's check reads the tables' logs.
    input_removed = frozenset() if config.source.landed_files == "keep" else frozenset({"bronze"})
    outcomes = [
        repaired("", partial(repair_commit, spark, damaged, checkpoints, tables, input_removed))
        for damaged in damaged_commits(spark, tables)
    ]
    for job in [args.job] if args.job else STREAMS:
        if job in checkpoints:
            outcome = repaired(f"{job}: ", partial(repair_checkpoint, spark, checkpoints[job], tables))
            if outcome == []:
                print(f"tidemark repair: {job}: its checkpoint is whole")
            outcomes.append(outcome)
    return 1 if None in outcomes else 0


def repaired(prefix: str, repair: Callable[[], list[str]]) -> list[str] | None:
    """The paths ``repair`` removed, each printed; None, its reason printed, where it refused."""
    try:
        removed = repair()
    except UnsafeRepair as error:
        print(f"tidemark repair: {prefix}{error}", file=sys.stderr)
        return None
    for path in removed:
        print(f"tidemark repair: {prefix}removed {path}")
    return removed


if __name__ == "__main__":
    sys.exit(main())
