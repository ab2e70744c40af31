"""The SQL server, really started (`tidemark sql-server`, a Spark Thrift Server),
queried over the wire by the real client (`tidemark sql`, beeline) while a
streaming job commits to the same tables."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from spark_jobs.catalog import FoundTable, lakehouse_tables, register_tables
from spark_jobs.config import load_pipeline
from spark_jobs.generator import FleetSpec, Manifest, generate, malformed_kinds, write_landing
from spark_jobs.jobs.replay import replay
from spark_jobs.lakehouse.create import create_missing
from spark_jobs.lakehouse.log import FIRST_COMMIT
from spark_jobs.submit import submit_env
from spark_jobs.tables import TableRef, TableRegistry
from tests.integration.conftest import (
    delta_commits,
    job_running,
    run_job,
    wait_for,
    write_pipeline,
)
from tests.integration.sql_server import SqlServer, cookbook_statements, server_command, sql_server

pytestmark = [pytest.mark.spark, pytest.mark.slow]
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


@dataclass
class Served(SqlServer):
    pipeline: Path
    registry: TableRegistry
    landed: Manifest
    later: TableRegistry


@pytest.fixture(scope="module")
def served(spark, tmp_path_factory):
    """A lakehouse with every telemetry table written by a flushed replay, a second
    pipeline whose tables do not exist yet, and the server over the lakehouse, started
    with no pipeline file at all: it finds every table under the layer folders."""
    folder = tmp_path_factory.mktemp("sql")
    pipeline = write_pipeline(folder)
    later_pipeline = write_pipeline(folder, pipeline="fleet2")
    lakehouse = str(folder / "lakehouse")
    config = load_pipeline(pipeline)
    records = generate(
        FleetSpec(devices=6, partitions=2, seed=5, duration_ms=30 * 60_000, malformed_ratio=0.03),
        malformed_kinds("files"),
    )
    source = folder / "replayed.json"
    source.write_text("\n".join(record.line for record in records) + "\n")
    assert replay(spark, config, source, lakehouse, batch_size=200, flush=True) == 0

    with sql_server(lakehouse, folder / "no-pipelines") as server:
        yield Served(
            **server.__dict__,
            pipeline=pipeline,
            registry=TableRegistry(config, lakehouse),
            landed=Manifest.of(records),
            later=TableRegistry(load_pipeline(later_pipeline), lakehouse),
        )


def test_every_layer_answers_over_the_wire_with_the_rows_its_delta_table_holds(spark, served):
    tables = served.registry.all()
    assert {table.layer for table in tables} == {"bronze", "silver", "quarantine", "gold", "ops"}
    by_path = {t.sql_name: spark.read.format("delta").load(t.path).count() for t in tables}
    assert served.counts(tables) == by_path


def test_the_tables_reconcile_through_sql(served):
    """Nothing lost, nothing doubled, counted by the SQL server: input = bronze +
    rejects, and each bronze record (one tumbling window each) is on time in
    silver or quarantined."""
    name = served.registry.config.name
    bronze = served.value(f"SELECT count(*) FROM bronze.{name}")
    rejects = served.value(f"SELECT count(*) FROM ops.rejects WHERE pipeline = '{name}'")
    on_time = served.value(f"SELECT sum(record_count) FROM silver.{name}_windows")
    quarantined = served.value(f"SELECT count(*) FROM quarantine.{name}_late")
    assert rejects > 0 and bronze + rejects == served.landed.records
    assert on_time + quarantined == bronze


def test_history_and_time_travel_read_earlier_versions(spark, served):
    table = served.registry.bronze
    history = served.rows(f"DESCRIBE HISTORY {table.sql_name}")
    assert sorted(int(row["version"]) for row in history) == list(range(delta_commits(table.path)))
    first_write = min(int(row["version"]) for row in history if row["operation"] == "WRITE")
    expected = spark.read.format("delta").option("versionAsOf", first_write).load(table.path).count()
    assert 0 < expected < spark.read.format("delta").load(table.path).count()
    assert served.value(f"SELECT count(*) FROM {table.sql_name} VERSION AS OF {first_write}") == expected


def test_queries_see_a_running_stream_commit_and_tables_created_later(spark, served, tmp_path):
    registry, name = served.registry, served.registry.config.name
    before = served.value(f"SELECT count(*) FROM bronze.{name}")
    version_before = delta_commits(registry.bronze.path) - 1
    more = generate(
        FleetSpec(devices=4, partitions=2, seed=9, duration_ms=20 * 60_000, malformed_ratio=0.03),
        malformed_kinds("files"),
    )
    write_landing(more, registry.landing_path, records_per_file=100)
    extra = Manifest.of(more)
    # Waits watch the table here, each query over the wire is asked once: a client
    # call is a JVM of its own (1.5-2 CPU-s).
    with job_running(
        "bronze", served.pipeline, Path(registry.root), "--trigger", "continuous", "--interval", "2s"
    ):
        wait_for(
            lambda: delta_commits(registry.bronze.path) - 1 > version_before, 300, "the stream's first commit"
        )
        assert served.value(f"SELECT count(*) FROM bronze.{name}") > before
        # History shows the stream's commits, and time travel answers with the version
        # from before the stream, while it commits.
        history = served.rows(f"DESCRIBE HISTORY bronze.{name}")
        assert max(int(row["version"]) for row in history) > version_before
        assert served.value(f"SELECT count(*) FROM bronze.{name} VERSION AS OF {version_before}") == before
        wait_for(
            lambda: spark.read.format("delta").load(registry.bronze.path).count() == before + extra.valid,
            300,
            "every landed record in bronze",
            interval=2,
        )
        assert served.value(f"SELECT count(*) FROM bronze.{name}") == before + extra.valid
    assert served.value(f"SELECT count(*) FROM ops.rejects WHERE pipeline = '{name}'") == (
        served.landed.records - served.landed.valid + extra.records - extra.valid
    )

    # A pipeline no file given to the server names: its tables, once created, are found.
    assert not served.rows("SHOW TABLES IN bronze LIKE 'fleet2'")
    create_missing(spark, served.later)
    wait_for(
        lambda: served.rows("SHOW TABLES IN bronze LIKE 'fleet2'"),
        300,
        "fleet2's tables registered",
        interval=2,
    )
    own = [table for table in served.later.all() if table.layer != "ops"]
    assert served.counts(own) == {table.sql_name: 0 for table in own}


def test_the_catalog_finds_each_delta_table_in_a_layer_folder_and_nothing_else(spark, tmp_path):
    for folder in ("silver/mine", "gold/my-rollup", "_checkpoints/not_a_layer", "ops/_scratch"):
        spark.range(1).write.format("delta").save(str(tmp_path / folder))
    (tmp_path / "bronze" / "no_delta_log").mkdir(parents=True)
    (tmp_path / "quarantine").mkdir()
    (tmp_path / "quarantine" / "a_file").write_text("")
    found = lakehouse_tables(spark, str(tmp_path))
    assert sorted(found, key=lambda table: table.layer) == [
        FoundTable("gold", "my-rollup", f"{tmp_path}/gold/my-rollup"),
        FoundTable("silver", "mine", f"{tmp_path}/silver/mine"),
    ]


def test_a_table_another_process_was_creating_when_a_refresh_looked_is_registered_by_the_next(
    spark, tmp_path
):
    """The server's refresh can look at a table between its log folder's creation and
    its first commit (another process is creating it); the next refresh registers it."""
    written = tmp_path / "written"
    spark.range(3).write.format("delta").save(str(written))
    arriving = FoundTable("silver", "arriving_later", str(tmp_path / "silver" / "arriving_later"))
    log = Path(arriving.path, "_delta_log")
    log.mkdir(parents=True)
    try:
        assert register_tables(spark, [arriving]) == []
        # The other process's first commit lands: its files, then its log entry.
        for data in written.glob("*.parquet"):
            shutil.copy(data, arriving.path)
        shutil.copy(written / "_delta_log" / "00000000000000000000.json", log)
        assert register_tables(spark, [arriving]) == ["silver.arriving_later"]
        assert spark.table("silver.arriving_later").count() == 3
    finally:
        spark.sql("DROP TABLE IF EXISTS silver.arriving_later")


def left_behind(table: TableRef, modified: float) -> Path:
    """A data file no commit names (a failed write's), last modified at ``modified``."""
    orphan = Path(table.path) / f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    orphan.write_bytes(b"PAR1")
    os.utime(orphan, (modified, modified))
    return orphan


def test_maintenance_compacts_the_tables_the_server_names_and_vacuums_those_older_than_the_retention(
    spark, served
):
    """The maintenance job's OPTIMIZE runs against the catalog names the server
    serves; its commits show in the server's history and no row changes. VACUUM
    deletes a file no commit names once it is older than the retention, in a table
    that old; a table created within the retention is not listed at all."""
    table, young = served.registry.bronze, served.registry.silver
    before = served.value(f"SELECT count(*) FROM {table.sql_name}")
    files_before = int(served.rows(f"DESCRIBE DETAIL {table.sql_name}")[0]["numFiles"])
    assert files_before > 1
    eight_days_ago = time.time() - 8 * 24 * 3600
    os.utime(Path(table.path, "_delta_log", FIRST_COMMIT), (eight_days_ago, eight_days_ago))
    stale, kept = left_behind(table, eight_days_ago), left_behind(young, eight_days_ago)
    recent = left_behind(table, time.time() - 3600)
    output = run_job("maintenance", served.pipeline, Path(served.registry.root), streaming=False)
    detail = served.rows(f"DESCRIBE DETAIL {table.sql_name}")[0]
    assert int(detail["numFiles"]) == 1
    assert served.value(f"SELECT count(*) FROM {table.sql_name}") == before
    operations = [row["operation"] for row in served.rows(f"DESCRIBE HISTORY {table.sql_name} LIMIT 3")]
    assert "OPTIMIZE" in operations
    assert not stale.exists() and recent.exists() and kept.exists()
    said = dict(line.split(": ", 2)[1:] for line in output.splitlines() if line.startswith("tidemark maint"))
    assert said[table.sql_name] == f"{files_before} files compacted into 1; vacuumed (retaining 168 h)"
    assert said[young.sql_name].endswith("; not vacuumed: created within the 168 h retention")


def test_bad_sql_and_unknown_tables_get_the_servers_error_in_a_few_lines(served):
    typo = served.sql("SELEC count(*) FROM bronze.telemetry", output="table")
    assert typo.returncode == 1
    assert "[PARSE_SYNTAX_ERROR]" in typo.stderr and "'SELEC'" in typo.stderr
    unknown = served.sql("SELECT * FROM silver.no_such_table", output="table")
    assert unknown.returncode == 1
    assert "[TABLE_OR_VIEW_NOT_FOUND]" in unknown.stderr and "no_such_table" in unknown.stderr
    for failed in (typo, unknown):
        assert "\tat " not in failed.stderr and "Exception" not in failed.stderr
        assert len(failed.stderr.splitlines()) <= 6
    assert served.value("SELECT 41 + 1 AS answer") == 42


def test_the_server_and_its_driver_listen_on_loopback_only(served):
    server = psutil.Process(served.process.pid)
    listening = {
        (conn.laddr.ip, conn.laddr.port)
        for process in [server, *server.children(recursive=True)]
        for conn in process.net_connections(kind="inet")
        if conn.status == psutil.CONN_LISTEN
    }
    assert ("::ffff:127.0.0.1", served.port) in listening or ("127.0.0.1", served.port) in listening
    assert {ip for ip, _ in listening} <= LOOPBACK, listening
    outward = [
        address.address
        for addresses in psutil.net_if_addrs().values()
        for address in addresses
        if address.family == socket.AF_INET and not address.address.startswith("127.")
    ]
    for ip in outward:
        with pytest.raises(OSError):
            socket.create_connection((ip, served.port), timeout=5).close()


def test_a_port_in_use_is_refused_before_anything_is_written(served, tmp_path):
    lakehouse = tmp_path / "lakehouse"
    done = subprocess.run(
        server_command(served.port, str(lakehouse), served.pipeline),
        env=submit_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert f"127.0.0.1:{served.port} is in use" in done.stdout
    assert not lakehouse.exists()


def test_every_cookbook_statement_in_the_readme_runs(served):
    statements = cookbook_statements()
    assert len(statements) >= 9
    # One client session for all of them: beeline stops at the first failure and names it.
    done = served.sql(";\n".join(statements), timeout=600)
    assert done.returncode == 0, done.stderr


def test_the_client_runs_beeline_as_a_short_job_with_the_callers_own_options_last(served, monkeypatch):
    monkeypatch.setenv("SPARK_BEELINE_OPTS", "-XX:+PrintCommandLineFlags -XX:CICompilerCount=2")
    done = served.sql("SELECT 41 + 1 AS answer")
    assert done.returncode == 0, done.stderr
    flags, *result = done.stdout.splitlines()
    assert {"-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-XX:CICompilerCount=2"} <= set(flags.split())
    assert "-XX:CICompilerCount=1" not in flags.split()  # the caller's came last, and won
    assert result == ["answer", "42"]
