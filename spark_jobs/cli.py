"""The ``tidemark`` command: argument parsing and dispatch, nothing else."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from spark_jobs import __version__
from spark_jobs.config import ConfigError, load_pipeline


def _validate(args: argparse.Namespace) -> int:
    failed = 0
    for path in args.pipeline:
        try:
            config = load_pipeline(path)
        except ConfigError as error:
            print(f"tidemark: invalid pipeline: {error}", file=sys.stderr)
            failed += 1
        else:
            print(f"{path}: pipeline {config.name!r} is valid")
    return 2 if failed else 0


def _tables(args: argparse.Namespace) -> int:
    from spark_jobs.tables import TableRegistry

    config = load_pipeline(args.pipeline)
    registry = TableRegistry(config, args.lakehouse)
    created: set[str] = set()
    if args.create:
        from spark_jobs.session import build_session

        spark = build_session(f"tidemark-tables-{config.name}")
        created = {table.sql_name for table in registry.create_missing(spark)}
        spark.stop()
    for table in registry.all():
        marker = " (created)" if table.sql_name in created else ""
        print(f"{table.sql_name:<40} {table.path}{marker}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tidemark",
        description="Event-time streaming on Spark + Delta Lake, orchestrated by Airflow.",
    )
    parser.add_argument("--version", action="version", version=f"tidemark {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    validate = commands.add_parser("validate", help="check pipeline files and report the first error of each")
    validate.add_argument("pipeline", nargs="+", help="pipeline YAML file(s)")
    validate.set_defaults(handler=_validate)

    tables = commands.add_parser("tables", help="list a pipeline's tables (paths and SQL names)")
    tables.add_argument("--pipeline", required=True, help="pipeline YAML file")
    tables.add_argument("--lakehouse", help="lakehouse root (default: $LAKEHOUSE_DIR or ./lakehouse)")
    tables.add_argument("--create", action="store_true", help="create the tables that do not exist yet")
    tables.set_defaults(handler=_tables)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except ConfigError as error:
        print(f"tidemark: invalid pipeline: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
