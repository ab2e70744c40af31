"""``tidemark repair``: remove the last file of a stream's checkpoint log that a crash
of the machine left incomplete, where that is safe (DESIGN §6: nothing lost, nothing
doubled), so that the stream can start again. A file whose removal could lose or
double records is left, and the command says why and fails."""

from __future__ import annotations

import argparse
import sys

from spark_jobs.arguments import with_examples
from spark_jobs.config import PIPELINE_HELP, load_pipeline
from spark_jobs.jobs.common import default_checkpoint, exit_on_config_error, folder_argument
from spark_jobs.lakehouse.checkpoints import UnsafeRepair, is_checkpoint, repair_checkpoint
from spark_jobs.lakehouse.log import has_commits
from spark_jobs.session import build_session
from spark_jobs.tables import TableRegistry

STREAMS = ("bronze", "silver", "gold", "offline")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tidemark repair",
        description="Remove the incomplete last file of a pipeline's stream checkpoints "
        "(offsets/, commits/), where that loses and doubles nothing.",
    )
    with_examples(
        parser, "tidemark repair --pipeline telemetry", "tidemark repair --pipeline telemetry --job silver"
    )
    parser.add_argument("--pipeline", required=True, help=PIPELINE_HELP)
    parser.add_argument("--lakehouse", help="lakehouse root (default: $LAKEHOUSE_DIR or ./lakehouse)")
    parser.add_argument("--job", choices=STREAMS, help="one stream's checkpoint (default: every stream's)")
    return parser


@exit_on_config_error
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = load_pipeline(args.pipeline)
    registry = TableRegistry(config, folder_argument(args.lakehouse, "--lakehouse"))
    spark = build_session(f"tidemark-repair-{config.name}")
    tables = [table.path for table in registry.all() if has_commits(spark, table.path)]
    failed = False
    for job in [args.job] if args.job else STREAMS:
        checkpoint = default_checkpoint(registry, job)
        if not is_checkpoint(spark, checkpoint):
            continue
        try:
            removed = repair_checkpoint(spark, checkpoint, tables)
        except UnsafeRepair as error:
            print(f"tidemark repair: {job}: {error}", file=sys.stderr)
            failed = True
            continue
        for path in removed:
            print(f"tidemark repair: {job}: removed the damaged {path}")
        if not removed:
            print(f"tidemark repair: {job}: its checkpoint is whole")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
