"""The SQL server's catalog statements, its settings and the client's error
condensing, without a server."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from spark_jobs.catalog import (
    catalog_tables,
    register_statement,
    registries_for,
)
from spark_jobs.config import ConfigError, configured_pipeline_files
from spark_jobs.jobs.sql_server import build_parser, port_number, server_conf
from spark_jobs.sql import quote_identifier, string_literal
from spark_jobs.sql_client import condensed_error
from spark_jobs.tables import TableRef

PIPELINES = Path(__file__).resolve().parents[2] / "spark_jobs" / "pipelines"
UNKNOWN_TABLE = """WARNING: Using incubator modules: jdk.incubator.vector
Error: org.apache.hive.service.cli.HiveSQLException: Error running query: [TABLE_OR_VIEW_NOT_FOUND] \
org.apache.spark.sql.AnalysisException: [TABLE_OR_VIEW_NOT_FOUND] The table or view `nope` cannot be found.
Search path: [`system`.`builtin`].
To tolerate the error on drop use DROP VIEW IF EXISTS. SQLSTATE: 42P01; line 1 pos 14;
'Project [*]
+- 'UnresolvedRelation [nope], [], false

\tat org.apache.spark.sql.hive.thriftserver.HiveThriftServerErrors$.runningQueryError(x.scala:43)
Caused by: org.apache.spark.sql.AnalysisException: [TABLE_OR_VIEW_NOT_FOUND] again
"""
SYNTAX_ERROR = "\n".join(
    [
        "Error: org.apache.hive.service.cli.HiveSQLException: Error running query: [PARSE_SYNTAX_ERROR] "
        "org.apache.spark.sql.catalyst.parser.ParseException: ",
        "[PARSE_SYNTAX_ERROR] Syntax error at or near 'SELEC'. SQLSTATE: 42601 (line 1, pos 0)",
        "",
        "== SQL ==",
        "SELEC 1",
        "\tat org.apache.spark.sql.hive.thriftserver.X.run(X.scala:1)",
    ]
)


def test_an_unknown_table_is_reported_by_its_error_class_and_message_up_to_the_sqlstate():
    message = condensed_error(UNKNOWN_TABLE, "127.0.0.1", 10000)
    assert message.startswith("[TABLE_OR_VIEW_NOT_FOUND] The table or view `nope` cannot be found.")
    assert message.endswith("SQLSTATE: 42P01; line 1 pos 14;")
    assert "Exception" not in message and "Project" not in message and "\tat" not in message


def test_a_syntax_error_keeps_spark_s_message_without_the_java_wrappers():
    message = condensed_error(SYNTAX_ERROR, "127.0.0.1", 10000)
    assert message == "[PARSE_SYNTAX_ERROR] Syntax error at or near 'SELEC'. SQLSTATE: 42601 (line 1, pos 0)"


def test_an_unreachable_server_is_named_with_its_address():
    stderr = "Error: Could not open client transport with JDBC Uri: jdbc:hive2://127.0.0.1:10001: refused"
    assert "cannot reach the SQL server at 127.0.0.1:10001" in condensed_error(stderr, "127.0.0.1", 10001)


def test_identifiers_are_backquoted_with_inner_backquotes_doubled():
    assert quote_identifier("silver") == "`silver`"
    assert quote_identifier("a`b") == "`a``b`"


def test_string_literals_escape_quotes_and_backslashes():
    assert string_literal("/lake/it's\\x") == "'/lake/it\\'s\\\\x'"


def test_a_table_is_registered_as_an_external_delta_table_at_its_path():
    table = TableRef("silver", "telemetry_windows", "/lake/silver/telemetry_windows", None)  # type: ignore[arg-type]
    assert register_statement(table) == (
        "CREATE TABLE IF NOT EXISTS `silver`.`telemetry_windows` USING delta "
        "LOCATION '/lake/silver/telemetry_windows'"
    )


def test_the_shared_ops_tables_are_registered_once_for_many_pipelines(tmp_path):
    files = [str(PIPELINES / "telemetry.yaml"), str(PIPELINES / "clickstream.yaml")]
    tables = catalog_tables(registries_for(files, str(tmp_path)))
    names = [table.sql_name for table in tables]
    assert len(names) == len(set(names))
    assert {"ops.runs", "bronze.telemetry", "bronze.clickstream"} <= set(names)


def test_configured_pipelines_come_from_files_and_folders(tmp_path):
    (tmp_path / "a.yaml").write_text("pipeline: a\n")
    single = tmp_path / "other" / "b.yaml"
    single.parent.mkdir()
    single.write_text("pipeline: b\n")
    found = configured_pipeline_files(f"{tmp_path}:{single}")
    assert found == {"a": str(tmp_path / "a.yaml"), "b": str(single)}


def test_a_configured_entry_that_does_not_exist_is_an_error_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"TIDEMARK_PIPELINES: no file or folder '.*nowhere'"):
        configured_pipeline_files(f"{tmp_path}:{tmp_path / 'nowhere'}")


def test_the_server_binds_to_loopback_unless_told_otherwise():
    args = build_parser().parse_args([])
    assert (args.host, args.port) == ("127.0.0.1", 10000)
    conf = server_conf(args.host, args.port, "/state", local=True)
    assert conf["spark.hadoop.hive.server2.thrift.bind.host"] == "127.0.0.1"
    assert conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert conf["spark.ui.enabled"] == "false"


def test_a_cluster_master_leaves_the_driver_reachable():
    conf = server_conf("0.0.0.0", 10001, "/state", local=False)
    assert conf["spark.hadoop.hive.server2.thrift.bind.host"] == "0.0.0.0"
    assert "spark.driver.bindAddress" not in conf


@pytest.mark.parametrize("value", ["0", "65536", "-1", "ten", ""])
def test_ports_outside_the_tcp_range_are_refused(value):
    with pytest.raises(argparse.ArgumentTypeError, match="between 1 and 65535"):
        port_number(value)
