"""The session factory gives a Delta-enabled Spark with the jars resolved at setup."""

import json
import threading
from datetime import datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from delta.tables import DeltaTable
from py4j.clientserver import ClientServerConnection
from py4j.java_gateway import GatewayConnection
from pyspark.sql import Row
from pyspark.sql import functions as F

from spark_jobs.config import load_pipeline
from spark_jobs.jars import jars_dir, s3a_dir, tidemark_jar_dir, token_provider_dir
from spark_jobs.lakehouse.create import (
    ALL_FILES_IN_CHECKSUM,
    create_if_missing,
    create_missing,
    creation_lock,
)
from spark_jobs.lakehouse.log import discard_unfinished_creation, has_commits, table_version
from spark_jobs.tables import LAYERS, TableRegistry, ops_tables
from tests.generated_code import classes_compiled, expressions_compiled
from tests.unit.test_config import PIPELINES

pytestmark = pytest.mark.spark


def test_the_session_keeps_the_code_of_more_plans_than_sparks_default_hundred(spark):
    # Each literal is written into its plan's generated class: 150 distinct classes.
    def plan(number: int) -> int:
        return spark.range(2).selectExpr(f"id * 7 + {number} AS value").agg({"value": "sum"}).first()[0]

    with expressions_compiled(spark):
        for number in range(150):
            plan(number)
        compiled = classes_compiled(spark)
        assert [plan(number) for number in range(10)] == [7 + 2 * number for number in range(10)]
        assert classes_compiled(spark) == compiled


def test_building_columns_sends_the_jvm_no_python_call_sites(spark, monkeypatch):
    commands = []
    for connection in (ClientServerConnection, GatewayConnection):

        def recorded(self, command, *args, _send=connection.send_command, **kwargs):
            commands.append(command)
            return _send(self, command, *args, **kwargs)

        monkeypatch.setattr(connection, "send_command", recorded)
    frame = spark.range(3).select((F.col("id") * F.lit(2)).alias("twice"), F.when(F.col("id") > 1, "big"))
    assert [row.twice for row in frame.collect()] == [0, 2, 4]
    assert any("functions" in command for command in commands)
    assert not [command for command in commands if "PySparkCurrentOrigin" in command]


def test_session_uses_utc_and_only_local_jar_files(spark):
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    jars = spark.sparkContext.getConf().get("spark.jars").split(",")
    folders = (str(jars_dir()), str(token_provider_dir()), str(s3a_dir()), str(tidemark_jar_dir()))
    assert jars and all(jar.startswith(folders) and jar.endswith(".jar") for jar in jars)
    assert spark.conf.get("spark.jars.packages", None) is None


def test_delta_write_merge_read_back_and_time_travel(spark, tmp_path):
    path = str(tmp_path / "devices")
    spark.createDataFrame([Row(device="a", trips=1), Row(device="b", trips=2)]).write.format("delta").save(
        path
    )

    updates = spark.createDataFrame([Row(device="b", trips=20), Row(device="c", trips=3)])
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(updates.alias("u"), "t.device = u.device")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )

    now = {r.device: r.trips for r in spark.read.format("delta").load(path).collect()}
    before = {
        r.device: r.trips for r in spark.read.format("delta").option("versionAsOf", 0).load(path).collect()
    }
    history = [r.operation for r in DeltaTable.forPath(spark, path).history().orderBy("version").collect()]
    assert now == {"a": 1, "b": 20, "c": 3}
    assert before == {"a": 1, "b": 2}
    assert history == ["WRITE", "MERGE"]


def test_table_version_is_the_latest_commit_including_one_made_by_another_process(spark, tmp_path):
    path = tmp_path / "versions"
    spark.range(3).write.format("delta").save(str(path))
    spark.range(3).write.format("delta").mode("append").save(str(path))
    assert table_version(spark, str(path)) == 1
    # Another process's commit, unseen by this session's cached log: version 1's
    # actions again, under the next version.
    log = path / "_delta_log"
    (log / "00000000000000000002.json").write_text((log / "00000000000000000001.json").read_text())
    assert table_version(spark, str(path)) == 2


def test_registry_names_every_table_of_the_design_under_its_layer(tmp_path):
    config = load_pipeline(PIPELINES / "telemetry.yaml")
    registry = TableRegistry(config, str(tmp_path))

    names = {t.sql_name for t in registry.all()}
    assert names == {
        "bronze.telemetry",
        "silver.telemetry_windows",
        "quarantine.telemetry_late",
        "gold.telemetry_region_hourly",
        "gold.telemetry_status_events",
        "silver.telemetry_offline_state",
        "quarantine.telemetry_late_tracks",
        "ops.rejects",
        "ops.watermarks",
        "ops.watermark_history",
        "ops.runs",
    }
    for table in registry.all():
        assert table.layer in LAYERS
        assert table.path == f"{tmp_path}/{table.layer}/{table.name}"
    assert registry.landing_path == f"{tmp_path}/landing/telemetry"


def test_silver_carries_keys_measures_and_their_mergeable_state(tmp_path):
    registry = TableRegistry(load_pipeline(PIPELINES / "telemetry.yaml"), str(tmp_path))
    silver = registry.silver.schema.fieldNames()
    for column in ("window_start", "window_end", "region", "device_id", "record_count", "revision", "status"):
        assert column in silver
    assert {"battery_avg", "battery_avg_sum", "battery_avg_n", "battery_min", "speed_max"} <= set(silver)
    gold = registry.gold.schema.fieldNames()
    assert "battery_avg" in gold and "battery_avg_sum" not in gold


def test_a_pipeline_without_gold_or_offline_has_no_such_tables(tmp_path):
    registry = TableRegistry(load_pipeline(PIPELINES / "clickstream.yaml"), str(tmp_path))
    assert registry.gold is None and registry.status_events is None
    assert registry.offline_state is None and registry.late_tracks is None
    assert "session_id_approx_distinct_sketch" in registry.silver.schema.fieldNames()


def test_create_missing_is_idempotent_and_uses_the_explicit_schemas(spark, tmp_path):
    registry = TableRegistry(load_pipeline(PIPELINES / "telemetry.yaml"), str(tmp_path))

    first = create_missing(spark, registry)
    second = create_missing(spark, registry)

    assert {t.sql_name for t in first} == {t.sql_name for t in registry.all()}
    assert second == []
    for table in registry.all():
        stored = spark.read.format("delta").load(table.path).schema
        assert [(f.name, f.dataType) for f in stored] == [(f.name, f.dataType) for f in table.schema]
    details = DeltaTable.forPath(spark, registry.quarantine.path).detail().collect()[0]
    assert details.partitionColumns == ["status"]


def test_ops_tables_are_shared_by_pipelines(tmp_path):
    telemetry = TableRegistry(load_pipeline(PIPELINES / "telemetry.yaml"), str(tmp_path))
    clicks = TableRegistry(load_pipeline(PIPELINES / "clickstream.yaml"), str(tmp_path))
    assert telemetry.ops == clicks.ops == {t.name: t for t in ops_tables(str(tmp_path))}


def test_a_table_whose_creation_was_killed_before_its_first_commit_is_created(spark, tmp_path):
    # What a kill -9 during the first commit leaves: a log folder without a commit.
    registry = TableRegistry(load_pipeline(PIPELINES / "telemetry.yaml"), str(tmp_path))
    table = registry.ops["watermarks"]
    (Path(table.path) / "_delta_log" / "_staged_commits").mkdir(parents=True)
    assert create_if_missing(spark, table) is True
    assert DeltaTable.isDeltaTable(spark, table.path)
    assert spark.read.format("delta").load(table.path).schema == table.schema


def test_a_table_with_commits_is_never_discarded(spark, tmp_path):
    registry = TableRegistry(load_pipeline(PIPELINES / "telemetry.yaml"), str(tmp_path))
    table = registry.ops["watermarks"]
    assert create_if_missing(spark, table) is True
    assert discard_unfinished_creation(spark, table.path) is False
    assert create_if_missing(spark, table) is False


def test_table_creation_waits_for_another_job_creating_tables_in_the_same_lakehouse(spark, tmp_path):
    # Two JVMs committing version 0 of one table together corrupt its log (the
    # commit of one, the checksum of the other): creation is serialised per lakehouse.
    registry = TableRegistry(load_pipeline(PIPELINES / "telemetry.yaml"), str(tmp_path))
    created: list = []
    with creation_lock(registry.root):
        creating = threading.Thread(target=lambda: created.extend(create_missing(spark, registry)))
        creating.start()
        creating.join(timeout=3)
        assert creating.is_alive()
        assert not any(has_commits(spark, table.path) for table in registry.all())
    creating.join(timeout=120)
    assert {t.sql_name for t in created} == {t.sql_name for t in registry.all()}
    assert all(has_commits(spark, table.path) for table in registry.all())


def ungrouped_jobs(spark) -> set[int]:
    return set(spark.sparkContext.statusTracker().getJobIdsForGroup())


def checksum(table_path: str, version: int) -> dict:
    return json.loads((Path(table_path) / "_delta_log" / f"{version:020d}.crc").read_text())


def test_creating_a_pipelines_tables_runs_no_spark_job_and_leaves_the_session_as_it_was(spark, tmp_path):
    registry = TableRegistry(load_pipeline(PIPELINES / "telemetry.yaml"), str(tmp_path))
    before, setting = ungrouped_jobs(spark), spark.conf.get(ALL_FILES_IN_CHECKSUM, None)
    assert create_missing(spark, registry)
    assert ungrouped_jobs(spark) == before
    assert spark.conf.get(ALL_FILES_IN_CHECKSUM, None) == setting


def test_a_new_tables_checksum_lists_its_files_so_the_next_commits_list_theirs(spark, tmp_path):
    registry = TableRegistry(load_pipeline(PIPELINES / "telemetry.yaml"), str(tmp_path))
    create_missing(spark, registry)
    table = registry.ops["rejects"]
    assert checksum(table.path, 0)["allFiles"] == []
    row = Row(
        pipeline="p",
        raw_record="{",
        reason="malformed_record",
        detail="not valid",
        source_partition=None,
        source_file="f",
        source_offset=1,
        ingest_time=datetime(2026, 1, 1),
        rejected_at=datetime(2026, 1, 1),
    )
    spark.createDataFrame([row], table.schema).write.format("delta").mode("append").save(table.path)
    listed = checksum(table.path, 1)["allFiles"]
    assert [Path(file["path"]).suffix for file in listed] == [".parquet"]


def test_delta_files_store_timestamps_as_parquets_64_bit_microseconds(spark, tmp_path):
    """Not Spark's default INT96, which Parquet has deprecated and which costs every
    timestamp column a dictionary of 12-byte arrays."""
    table = str(tmp_path / "t")
    moment = spark.createDataFrame([(datetime(2026, 1, 1, 12, 0, 0, 1),)], "at timestamp")
    moment.coalesce(1).write.format("delta").save(table)
    [data_file] = Path(table).glob("*.parquet")
    column = pq.ParquetFile(data_file).schema.column(0)
    logical = json.loads(column.logical_type.to_json())
    assert (column.physical_type, logical["Type"], logical["isAdjustedToUTC"], logical["timeUnit"]) == (
        "INT64",
        "Timestamp",
        True,
        "microseconds",
    )
    assert spark.read.format("delta").load(table).first().at == datetime(2026, 1, 1, 12, 0, 0, 1)
