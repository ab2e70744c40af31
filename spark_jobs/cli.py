"""The ``tidemark`` command: argument parsing and dispatch, nothing else."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from spark_jobs import __version__
from spark_jobs.arguments import (
    BAD_INPUT,
    EXAMPLE_PIPELINE,
    FAILED,
    config_error_message,
    non_negative_int,
    port,
    positive_float,
    positive_int,
    print_error,
    share,
    with_examples,
)
from spark_jobs.config import PIPELINE_HELP, ConfigError, load_pipeline
from spark_jobs.lakehouse.create import create_missing
from spark_jobs.sql_client import DEFAULT_HOST, DEFAULT_PORT, FORMATS

if TYPE_CHECKING:  # the CLI imports Spark only for the commands that need it
    from pyspark.sql import SparkSession

    from spark_jobs.config import PipelineConfig
    from spark_jobs.generator import FleetSpec, Manifest
    from spark_jobs.tables import TableRegistry


def _validate(args: argparse.Namespace) -> int:
    failed = 0
    for path in args.pipeline:
        try:
            config = load_pipeline(path)
        except ConfigError as error:
            print_error("validate", config_error_message(error))
            failed += 1
        else:
            print(f"{path}: pipeline {config.name!r} is valid")
    return BAD_INPUT if failed else 0


def _tables(args: argparse.Namespace) -> int:
    from spark_jobs.tables import TableRegistry

    config = load_pipeline(args.pipeline)
    registry = TableRegistry(config, args.lakehouse)
    created: set[str] = set()
    counts: dict[str, str] = {}
    if args.create or args.counts:
        from spark_jobs.session import build_session

        spark = build_session(f"tidemark-tables-{config.name}")
        if args.create:
            created = {table.sql_name for table in create_missing(spark, registry)}
        if args.counts:
            counts = _row_counts(spark, registry)
        spark.stop()
    for table in registry.all():
        marker = " (created)" if table.sql_name in created else ""
        rows = f"{counts[table.sql_name]:>10}  " if counts else ""
        print(f"{table.sql_name:<40} {rows}{table.path}{marker}")
    return 0


def _row_counts(spark: SparkSession, registry: TableRegistry) -> dict[str, str]:
    """Rows per table; the shared ops tables count this pipeline's rows only."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    counts = {}
    for table in registry.all():
        if not DeltaTable.isDeltaTable(spark, table.path):
            counts[table.sql_name] = "-"
            continue
        rows = spark.read.format("delta").load(table.path)
        if table.layer == "ops":
            rows = rows.where(F.col("pipeline") == registry.config.name)
        counts[table.sql_name] = str(rows.count())
    return counts


JOBS = {
    "run": "a pipeline's bronze, silver, gold and offline streams as queries of one Spark application",
    "bronze": "ingest a pipeline's source into bronze and ops.rejects (streaming)",
    "silver": "event-time windows, quarantine and watermarks from bronze (streaming)",
    "gold": "the gold rollup of fired and closed silver windows (streaming)",
    "offline": "offline detection: buffered event-time timers -> status events (streaming)",
    "replay": "replay a static file through every streaming job with controlled micro-batches",
    "tune": "what silver would do under candidate watermark settings, over bronze or a file",
    "merge-late": "fold pending quarantined late records into silver and gold (batch)",
    "maintenance": "OPTIMIZE and VACUUM a pipeline's Delta tables, report checkpoint sizes (batch)",
    "check-idle": "mark idle partitions, advance quiet streams' watermarks, report stalled streams (batch)",
    "repair": "remove an incomplete last file of a pipeline's stream checkpoints, where that is safe",
}


def _run_job(job: str, job_args: Sequence[str]) -> int:
    """Run a job in this process; spark-submit runs the same module's main."""
    from importlib import import_module

    return import_module(f"spark_jobs.jobs.{job.replace('-', '_')}").main(list(job_args))


def _sql_server(argv: Sequence[str]) -> int:
    """Validate the arguments here, then become the spark-submit that runs the server:
    its settings (the Hive catalog, the class path) must exist before its JVM does."""
    import os

    from spark_jobs.jobs import sql_server
    from spark_jobs.submit import submit_command, submit_env

    master = os.environ.get("TIDEMARK_SPARK_MASTER") or "local[2]"
    conf = sql_server.submit_conf(list(argv), local=master.startswith("local"))
    command = submit_command("sql_server", list(argv), master=master, conf=conf)
    os.execve(command[0], command, submit_env())


def _sql(args: argparse.Namespace) -> int:
    from spark_jobs import sql_client

    if args.query is None:
        sql_client.interactive(args.host, args.port, args.format)
    code, result, error = sql_client.run_query(args.host, args.port, args.query, args.format)
    if result:
        print(result)
    if code:
        print_error("sql", error)
        return FAILED
    return 0


def _generate(args: argparse.Namespace) -> int:
    from spark_jobs.config import parse_duration
    from spark_jobs.generator import (
        FleetSpec,
        Manifest,
        generate,
        malformed_kinds,
        send_to_kafka,
        write_landing,
    )
    from spark_jobs.tables import TableRegistry

    if args.quiet_partitions >= args.partitions:
        problem = f"must leave a partition sending: below --partitions ({args.partitions})"
        raise ConfigError("--quiet-partitions", f"{problem}; got {args.quiet_partitions}")
    config = load_pipeline(args.pipeline)
    duration_ms = parse_duration(args.duration, "--duration", allow_zero=False) if args.duration else None
    spec = FleetSpec(
        devices=args.devices,
        partitions=args.partitions,
        seed=args.seed,
        duration_ms=duration_ms or 3_600_000,
        interval_ms=parse_duration(args.interval, "--interval", allow_zero=False),
        late_ratio=args.late_ratio,
        quiet_partitions=args.quiet_partitions,
        malformed_ratio=args.malformed_ratio,
    )
    landing = TableRegistry(config, args.lakehouse).landing_path
    if args.live:
        manifest = _generate_live(config, landing, spec, duration_ms)
    else:
        records = generate(spec, malformed_kinds(config.source.kind))
        manifest = Manifest.of(records)
        if config.source.kind == "kafka":
            send_to_kafka(records, config.source.bootstrap_servers, config.source.topic, args.rate)
        else:
            manifest.files = write_landing(
                records, landing, args.records_per_file, config.source.format, args.rate
            )
    print(manifest.to_json())
    return 0


def _generate_live(
    config: PipelineConfig, landing: str, spec: FleetSpec, duration_ms: int | None
) -> Manifest:
    import contextlib
    import signal
    import threading

    from spark_jobs.generator import feed_live, file_sender, kafka_sender, malformed_kinds

    # Ctrl-C and SIGTERM stop the feed between ticks: what it sent is whole and counted.
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda signum, frame: stop.set())
    if config.source.kind == "kafka":
        sender = kafka_sender(config.source.bootstrap_servers, config.source.topic)
    else:
        sender = contextlib.nullcontext(file_sender(landing, config.source.format))
    with sender as send:
        return feed_live(spec, send, malformed_kinds(config.source.kind), duration_ms, stop.is_set)


def _command(
    commands: argparse._SubParsersAction, name: str, summary: str, *examples: str
) -> argparse.ArgumentParser:
    """A subcommand parsed here: ``summary`` in the command list and atop its help."""
    return with_examples(
        commands.add_parser(name, help=summary, description=f"{summary[0].upper()}{summary[1:]}."), *examples
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tidemark",
        description="Event-time streaming on Spark + Delta Lake, orchestrated by Airflow.",
    )
    with_examples(
        parser,
        f"tidemark validate {EXAMPLE_PIPELINE}",
        "tidemark generate --pipeline telemetry --devices 20 --duration 30m",
        "tidemark run --pipeline telemetry --trigger available-now",
    )
    parser.add_argument("--version", action="version", version=f"tidemark {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    validate = _command(
        commands,
        "validate",
        "check pipeline files and report the first error of each",
        f"tidemark validate {EXAMPLE_PIPELINE}",
        "tidemark validate spark_jobs/pipelines/*.yaml",
    )
    validate.add_argument("pipeline", nargs="+", help="pipeline YAML file(s)")
    validate.set_defaults(handler=_validate)

    tables = _command(
        commands,
        "tables",
        "list a pipeline's tables (paths and SQL names)",
        f"tidemark tables --pipeline {EXAMPLE_PIPELINE}",
        "tidemark tables --pipeline telemetry --create --counts",
    )
    tables.add_argument("--pipeline", required=True, help=PIPELINE_HELP)
    tables.add_argument("--lakehouse", help="lakehouse root (default: $LAKEHOUSE_DIR or ./lakehouse)")
    tables.add_argument("--create", action="store_true", help="create the tables that do not exist yet")
    tables.add_argument("--counts", action="store_true", help="count each table's rows (starts Spark)")
    tables.set_defaults(handler=_tables)

    for job, summary in JOBS.items():
        # Listed for --help only: main() hands a job's arguments to the job's own parser.
        commands.add_parser(job, help=f"{summary}; see `tidemark {job} --help`", add_help=False)

    commands.add_parser(
        "sql-server",
        help="serve every table over SQL (Spark Thrift Server); see `tidemark sql-server --help`",
        add_help=False,
    )
    sql = _command(
        commands,
        "sql",
        "run SQL on the SQL server, or open its interactive client",
        'tidemark sql "SELECT * FROM gold.telemetry_region_hourly LIMIT 10"',
        'tidemark sql --format csv "SELECT count(*) FROM bronze.telemetry"',
        "tidemark sql",
    )
    sql.add_argument("query", nargs="?", help="statements separated by ';' (none: interactive beeline)")
    sql.add_argument("--host", default=DEFAULT_HOST, help="the SQL server's address")
    sql.add_argument("--port", type=port, default=DEFAULT_PORT, help="the SQL server's port")
    sql.add_argument("--format", choices=sorted(FORMATS), default="table", help="result format")
    sql.set_defaults(handler=_sql)

    gen = _command(
        commands,
        "generate",
        "generate scooter telemetry into a pipeline's landing zone or Kafka topic",
        "tidemark generate --pipeline telemetry --devices 20 --late-ratio 0.05",
        "tidemark generate --pipeline telemetry --live --interval 5s --duration 10m",
    )
    gen.add_argument("--pipeline", required=True, help=f"{PIPELINE_HELP}; where the data goes")
    gen.add_argument("--lakehouse", help="lakehouse root (default: $LAKEHOUSE_DIR or ./lakehouse)")
    gen.add_argument("--devices", type=positive_int, default=50, help="scooters in the fleet")
    gen.add_argument(
        "--partitions", type=positive_int, default=4, help="source partitions the devices are hashed to"
    )
    gen.add_argument("--seed", type=int, default=0, help="random seed: the same seed, the same data")
    gen.add_argument(
        "--duration",
        help="event-time span of the data (default: 1h); with --live, how long to send "
        "(default: until stopped)",
    )
    gen.add_argument("--interval", default="10s", help="how often each device sends a track")
    gen.add_argument("--late-ratio", type=share, default=0.0, help="share of records uploaded late")
    gen.add_argument("--malformed-ratio", type=share, default=0.0, help="share of malformed records")
    gen.add_argument(
        "--quiet-partitions", type=non_negative_int, default=0, help="partitions that go quiet half-way"
    )
    gen.add_argument(
        "--records-per-file",
        type=positive_int,
        default=1000,
        help="records per landing file, for a file source",
    )
    gen.add_argument("--rate", type=positive_float, help="records per second (default: as fast as possible)")
    gen.add_argument(
        "--live",
        action="store_true",
        help="send current telemetry as it happens, every second, until stopped (Ctrl-C, SIGTERM): "
        "uploads come minutes late, quiet partitions go dark half-way through every other 4-minute "
        "stretch and send their backlog when it ends",
    )
    gen.set_defaults(handler=_generate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Every error ends as ``tidemark <command>: error: <message>`` on stderr (see
    :func:`print_error`): exit 2 for a bad command line or pipeline file, before
    anything runs, 1 for a failure while running. The jobs report their own the
    same way (``exit_with_named_errors``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[0] if argv else None
    if command in JOBS:
        return _run_job(command, argv[1:])
    try:
        if command == "sql-server":
            return _sql_server(argv[1:])
        args = build_parser().parse_args(argv)
        command = args.command
        return args.handler(args)
    except ConfigError as error:
        print_error(command, config_error_message(error))
        return BAD_INPUT
    except OSError as error:  # a file, a folder or a program that could not be used
        print_error(command, str(error))
        return FAILED


if __name__ == "__main__":
    sys.exit(main())
