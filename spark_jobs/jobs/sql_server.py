"""``tidemark sql-server``: a Spark Thrift Server (HiveServer2 protocol) over every
Delta table of the lakehouse, each under its layer schema (``bronze.telemetry``,
``ops.runs``...): the tables of the configured pipelines and every table found in
a layer folder (``<lakehouse>/<layer>/<table>``), a pipeline replayed from a file
of your own included. Tables created later are picked up every ``--refresh``.

The server owns the persistent catalog (an embedded Derby metastore, which
allows one process); the jobs keep writing path-based tables, so the server
reads what they commit without sharing a catalog with them. It binds to
127.0.0.1 unless ``--host`` says otherwise, and so does its driver.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

from spark_jobs.arguments import port as port_number
from spark_jobs.arguments import with_examples
from spark_jobs.catalog import (
    catalog_tables,
    lakehouse_tables,
    register_tables,
    registries_for,
)
from spark_jobs.config import configured_pipeline_files, parse_duration
from spark_jobs.jobs.common import exit_with_named_errors
from spark_jobs.jvm import java_class
from spark_jobs.sql_client import DEFAULT_HOST, DEFAULT_PORT
from spark_jobs.tables import join, lakehouse_root

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tidemark sql-server",
        description="A Spark Thrift Server (HiveServer2 protocol) over every Delta table of the "
        "lakehouse, each under its layer schema (bronze.telemetry, ops.runs...).",
    )
    with_examples(
        parser,
        "tidemark sql-server",
        "tidemark sql-server --pipeline telemetry --port 10001",
    )
    parser.add_argument(
        "--pipeline",
        action="append",
        help="pipeline YAML file, repeatable (default: every file in $TIDEMARK_PIPELINES, "
        "else the shipped pipelines); tables found under the lakehouse need none",
    )
    parser.add_argument("--lakehouse", help="lakehouse root (default: $LAKEHOUSE_DIR or ./lakehouse)")
    parser.add_argument("--port", type=port_number, default=DEFAULT_PORT, help="the port to listen on")
    parser.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help="address to listen on; 0.0.0.0 exposes the server to the network",
    )
    parser.add_argument("--refresh", default="10s", help="how often tables created later are registered")
    parser.add_argument(
        "--state-dir",
        help="metastore folder (default: <lakehouse>/_sql for a local lakehouse, else ./.tidemark/sql)",
    )
    return parser


def state_dir(args: argparse.Namespace) -> str:
    if args.state_dir:
        return os.path.abspath(args.state_dir)
    root = lakehouse_root(args.lakehouse)
    return join(root, "_sql") if "://" not in root else os.path.abspath(".tidemark/sql")


def server_conf(host: str, port: int, state: str, local: bool) -> dict[str, str]:
    """The session settings that make a Delta-aware Thrift server."""
    conf = {
        "spark.sql.catalogImplementation": "hive",
        "spark.hadoop.hive.server2.thrift.bind.host": host,
        "spark.hadoop.hive.server2.thrift.port": str(port),
        "spark.hadoop.javax.jdo.option.ConnectionURL": (
            f"jdbc:derby:;databaseName={join(state, 'metastore_db')};create=true"
        ),
        "spark.sql.warehouse.dir": join(state, "warehouse"),
        # The web UI would listen on every interface; the server's address is the only door.
        "spark.ui.enabled": "false",
    }
    if local:
        conf.update({"spark.driver.bindAddress": DEFAULT_HOST, "spark.driver.host": DEFAULT_HOST})
    return conf


def submit_conf(argv: list[str], local: bool) -> dict[str, str]:
    """``server_conf`` for a command line; spark-submit needs it before the JVM starts."""
    args = build_parser().parse_args(argv)
    return server_conf(args.host, args.port, state_dir(args), local)


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


@exit_with_named_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    refresh_s = parse_duration(args.refresh, "--refresh", allow_zero=False) / 1000
    files = args.pipeline or list(configured_pipeline_files().values())
    configured = catalog_tables(registries_for(files, args.lakehouse))
    root = lakehouse_root(args.lakehouse)
    if port_in_use(args.host, args.port):
        print(f"tidemark sql-server: {args.host}:{args.port} is in use (choose another --port)")
        return 2
    if args.host not in LOOPBACK:
        print(f"tidemark sql-server: WARNING: listening on {args.host}, not only on this machine")

    from spark_jobs.session import build_session

    state = state_dir(args)
    os.makedirs(state, exist_ok=True)
    # The driver's loopback binding for a local master comes with the spark-submit
    # command (submit_conf); a cluster master needs the driver reachable.
    overrides = server_conf(args.host, args.port, state, local=False)
    spark = build_session("tidemark-sql-server", overrides=overrides)
    # Derby writes derby.log into the working directory unless told where its home is.
    java_class(spark, "java.lang.System").setProperty("derby.system.home", state)

    def register_new() -> list[str]:
        return register_tables(spark, [*configured, *lakehouse_tables(spark, root)])

    registered = register_new()
    thrift = java_class(spark, "org.apache.spark.sql.hive.thriftserver.HiveThriftServer2")
    thrift.startWithContext(spark._jsparkSession.sqlContext())
    print(
        f"tidemark sql-server: listening on jdbc:hive2://{args.host}:{args.port} "
        f"({len(registered)} tables registered from {root})",
        flush=True,
    )
    while True:
        time.sleep(refresh_s)
        try:
            for name in register_new():
                print(f"tidemark sql-server: registered {name}", flush=True)
        except Exception as error:  # a failed refresh must not take the server down
            print(f"tidemark sql-server: refresh failed, retrying: {error}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
