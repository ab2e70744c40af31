"""Delta transactions Tidemark drives itself (``spark_jobs.lakehouse.transaction``): a partition
writer that names the files it replaces, and tables created by one commit. Each
outcome is checked against what Delta's own APIs say of the table."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.errors.exceptions import captured
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from spark_jobs.jvm import java_class
from spark_jobs.lakehouse.create import create_if_missing
from spark_jobs.lakehouse.log import DELTA_LOG, batch_metadata
from spark_jobs.lakehouse.table_files import read_latest
from spark_jobs.lakehouse.transaction import (
    CONFLICTS,
    ConflictsExhausted,
    PartitionWriter,
    Transaction,
    retry_on_conflict,
)
from spark_jobs.sql import is_in_sql, local_rows
from spark_jobs.tables import TableRef, ops_tables
from tests.integration.engine import jobs_run

pytestmark = pytest.mark.spark

SCHEMA = StructType(
    [
        StructField("key", StringType(), False),
        StructField("total", LongType(), False),
        StructField("status", StringType(), False),
    ]
)
IN_PLAY = frozenset({"open"})


@pytest.fixture
def table(spark, tmp_path) -> str:
    """A table partitioned by status, with one open and one closed row."""
    path = str(tmp_path / "table")
    DeltaTable.create(spark).location(path).addColumns(SCHEMA).partitionedBy("status").property(
        "delta.enableChangeDataFeed", "true"
    ).execute()
    spark.createDataFrame([("a", 1, "open"), ("z", 9, "closed")], SCHEMA).write.format("delta").mode(
        "append"
    ).save(path)
    return path


def rows(spark, path: str) -> list[tuple]:
    return sorted(tuple(row) for row in spark.read.format("delta").load(path).collect())


def add_one(rows: DataFrame) -> DataFrame:
    return rows.withColumn("total", F.col("total") + 1)


def counting_state_reads(monkeypatch) -> list[str]:
    """The predicates the writer asked the table's state for, in order."""
    asked: list[str] = []
    original = Transaction.partition_files

    def partition_files(self, column: str, values: frozenset[str]):
        asked.append(is_in_sql(column, sorted(values)))
        return original(self, column, values)

    monkeypatch.setattr(Transaction, "partition_files", partition_files)
    return asked


def append_open_row(spark, path: str) -> None:
    spark.createDataFrame([("c", 3, "open")], SCHEMA).write.format("delta").mode("append").save(path)


def test_an_overwrite_replaces_its_partitions_rows_and_leaves_the_others(spark, table):
    PartitionWriter(table, "status", IN_PLAY).overwrite(spark, add_one, "w:1")

    assert rows(spark, table) == [("a", 2, "open"), ("z", 9, "closed")]
    last = DeltaTable.forPath(spark, table).history(1).first()
    assert (last.operation, last.userMetadata) == ("WRITE", "w:1")
    assert last.operationParameters["mode"] == "Overwrite"


def test_a_writer_asks_the_tables_state_once_and_then_names_the_files_it_wrote(spark, table, monkeypatch):
    asked = counting_state_reads(monkeypatch)
    writer = PartitionWriter(table, "status", IN_PLAY)

    for batch in range(3):
        writer.overwrite(spark, add_one, f"w:{batch}")

    assert asked == ["status IN ('open')"]
    assert rows(spark, table) == [("a", 4, "open"), ("z", 9, "closed")]


def test_rows_moved_to_another_partition_land_there_and_leave_the_writers_files(spark, table, monkeypatch):
    asked = counting_state_reads(monkeypatch)
    writer = PartitionWriter(table, "status", IN_PLAY)

    writer.overwrite(spark, lambda current: current.withColumn("status", F.lit("closed")), "w:1")
    writer.overwrite(
        spark, lambda current: current.unionByName(spark.createDataFrame([("b", 5, "open")], SCHEMA)), "w:2"
    )

    assert rows(spark, table) == [("a", 1, "closed"), ("b", 5, "open"), ("z", 9, "closed")]
    assert len(asked) == 1


def test_a_rewrite_by_another_writer_of_the_partitions_is_followed_through_the_log(spark, table, monkeypatch):
    asked = counting_state_reads(monkeypatch)
    writer = PartitionWriter(table, "status", IN_PLAY)
    writer.overwrite(spark, add_one, "w:1")

    DeltaTable.forPath(spark, table).update(F.col("key") == "a", {"total": F.lit(100)})
    writer.overwrite(spark, add_one, "w:2")

    # Nothing doubled: the row the other writer rewrote is read from its file, once.
    assert rows(spark, table) == [("a", 101, "open"), ("z", 9, "closed")]
    assert len(asked) == 1


def test_an_append_by_another_writer_to_the_partitions_is_followed_through_the_log(spark, table, monkeypatch):
    asked = counting_state_reads(monkeypatch)
    writer = PartitionWriter(table, "status", IN_PLAY)
    writer.overwrite(spark, add_one, "w:1")

    append_open_row(spark, table)
    writer.overwrite(spark, add_one, "w:2")

    assert rows(spark, table) == [("a", 3, "open"), ("c", 4, "open"), ("z", 9, "closed")]
    assert len(asked) == 1


def test_a_compaction_of_the_partitions_is_followed_through_the_log(spark, table, monkeypatch):
    asked = counting_state_reads(monkeypatch)
    writer = PartitionWriter(table, "status", IN_PLAY)
    writer.overwrite(spark, add_one, "w:1")
    append_open_row(spark, table)
    append_open_row(spark, table)

    DeltaTable.forPath(spark, table).optimize().where("status = 'open'").executeCompaction()
    writer.overwrite(spark, add_one, "w:2")

    assert rows(spark, table) == [("a", 3, "open"), ("c", 4, "open"), ("c", 4, "open"), ("z", 9, "closed")]
    assert len(asked) == 1


def test_a_change_of_the_tables_metadata_makes_the_writer_ask_the_tables_state_again(
    spark, table, monkeypatch
):
    asked = counting_state_reads(monkeypatch)
    writer = PartitionWriter(table, "status", IN_PLAY)
    writer.overwrite(spark, add_one, "w:1")

    spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('delta.appendOnly' = 'false')")
    writer.overwrite(spark, add_one, "w:2")

    assert rows(spark, table) == [("a", 3, "open"), ("z", 9, "closed")]
    assert len(asked) == 2


def test_a_change_by_another_writer_to_other_partitions_leaves_the_writers_files_current(
    spark, table, monkeypatch
):
    asked = counting_state_reads(monkeypatch)
    writer = PartitionWriter(table, "status", IN_PLAY)
    writer.overwrite(spark, add_one, "w:1")

    DeltaTable.forPath(spark, table).update(F.col("key") == "z", {"total": F.lit(10)})
    writer.overwrite(spark, add_one, "w:2")

    assert rows(spark, table) == [("a", 3, "open"), ("z", 10, "closed")]
    assert len(asked) == 1


def adding_one_while(spark, table: str, other_writer):
    """``add_one``, with ``other_writer`` committing to the table while the overwrite runs."""

    def racing(current: DataFrame) -> DataFrame:
        other_writer(spark, table)
        return add_one(current)

    return racing


@pytest.mark.parametrize(
    ("other_writer", "open_after"),
    [
        (
            lambda spark, path: (
                spark.createDataFrame([("c", 3, "open")], SCHEMA)
                .write.format("delta")
                .mode("overwrite")
                .option("replaceWhere", "status = 'open'")
                .save(path)
            ),
            [("c", 4, "open")],
        ),
        (append_open_row, [("a", 2, "open"), ("c", 4, "open")]),
    ],
    ids=["replaces the writer's partitions", "appends to the writer's partitions"],
)
def test_a_commit_that_lands_in_the_writers_partitions_during_the_overwrite_fails_it(
    spark, table, other_writer, open_after
):
    writer = PartitionWriter(table, "status", IN_PLAY)
    racing = adding_one_while(spark, table, other_writer)

    with pytest.raises(CONFLICTS):
        writer.overwrite(spark, racing, "w:1")
    assert writer.kept is None
    # The retry reads the partitions afresh: nothing the other writer committed is lost.
    writer.overwrite(spark, add_one, "w:2")
    assert [row for row in rows(spark, table) if row[2] == "open"] == open_after


def rewrite_closed_row(spark, path: str) -> None:
    DeltaTable.forPath(spark, path).update(F.col("key") == "z", {"total": F.lit(10)})


def append_closed_row(spark, path: str) -> None:
    spark.createDataFrame([("y", 8, "closed")], SCHEMA).write.format("delta").mode("append").save(path)


@pytest.mark.parametrize(
    ("other_writer", "closed_after"),
    [
        (rewrite_closed_row, [("z", 10, "closed")]),
        (append_closed_row, [("y", 8, "closed"), ("z", 9, "closed")]),
    ],
    ids=["rewrites another partition", "appends to another partition"],
)
def test_a_commit_to_another_partition_during_the_overwrite_does_not_fail_it(
    spark, table, other_writer, closed_after
):
    writer = PartitionWriter(table, "status", IN_PLAY)
    racing = adding_one_while(spark, table, other_writer)

    writer.overwrite(spark, racing, "w:1")

    assert rows(spark, table) == [("a", 2, "open"), *closed_after]


def test_a_created_table_has_the_protocol_schema_partitions_and_properties_of_a_built_one(spark, tmp_path):
    properties = (("delta.enableChangeDataFeed", "true"), ("delta.dataSkippingStatsColumns", "key"))
    ours = TableRef("test", "ours", str(tmp_path / "ours"), SCHEMA, ("status",), properties)
    built = str(tmp_path / "built")
    builder = DeltaTable.create(spark).location(built).addColumns(SCHEMA).partitionedBy("status")
    for key, value in ours.table_properties.items():
        builder = builder.property(key, value)
    builder.execute()

    assert create_if_missing(spark, ours)

    def described(path: str) -> tuple:
        detail = DeltaTable.forPath(spark, path).detail().first()
        return (
            detail.minReaderVersion,
            detail.minWriterVersion,
            sorted(detail.tableFeatures),
            detail.partitionColumns,
            detail.properties,
            spark.read.format("delta").load(path).schema,
        )

    assert described(ours.path) == described(built)
    assert DeltaTable.forPath(spark, ours.path).history().first().operation == "CREATE TABLE"


def test_a_tables_log_takes_no_checkpoint_in_its_first_dozen_commits(spark, tmp_path):
    runs = next(table for table in ops_tables(str(tmp_path)) if table.name == "runs")
    create_if_missing(spark, runs)
    row = ("run", "silver", "telemetry", "running", 0, 0, 0, 0, 0, datetime(2026, 1, 2, tzinfo=UTC))
    for commit in range(12):
        txn = Transaction(spark, runs.path)
        txn.commit_append(txn.write_rows([row], StructType(runs.schema.fields[: len(row)])), f"c{commit}")

    assert DeltaTable.forPath(spark, runs.path).history(1).first().version == 12
    # Delta's default would have checkpointed version 10.
    assert not list((tmp_path / "ops" / "runs" / "_delta_log").glob("*.checkpoint*"))


def test_creating_a_table_that_exists_writes_nothing(spark, table):
    before = DeltaTable.forPath(spark, table).history().count()

    assert not create_if_missing(spark, TableRef("test", "t", table, SCHEMA, ("status",)))
    assert DeltaTable.forPath(spark, table).history().count() == before


def ops_rows(registry_root: str) -> dict[str, tuple[TableRef, list[tuple]]]:
    """Rows of three ops tables as the jobs write them: nulls, aware and naive times,
    an array of structs."""
    tables = {table.name: table for table in ops_tables(registry_root)}
    aware, naive = datetime(2026, 1, 2, 3, 4, 5, 678_901, tzinfo=UTC), datetime(2026, 1, 2, 3, 4, 5)
    clocks = [
        {
            "source_partition": "0",
            "max_event_ms": 5,
            "partition_watermark": -(2**63),
            "last_data_ms": None,
            "is_idle": False,
            "is_aligned": True,
            "generator_state": '{"s": 1}',
        }
    ]
    return {
        "watermark_history": (
            tables["watermark_history"],
            [("p1", 3, -(2**63), 1, 0, 2, 0, aware, None), ("p1", 4, 50, 1, 0, 0, 1, naive, clocks)],
        ),
        "runs": (
            tables["runs"],
            [
                ("r1", "silver", "p1", "running", 0, 0, 0, 0, 0, aware, None, None, None),
                ("r1", "silver", "p2", "failed", 2, 10, 8, 1, 1, aware, naive, 1_000, "boom: 'quoted' \n"),
            ],
        ),
        "watermarks": (
            tables["watermarks"],
            [("p1", "0", aware, 50, False, True, None, 4, naive, None)],
        ),
    }


@pytest.mark.parametrize("name", ["watermark_history", "runs", "watermarks"])
def test_rows_written_from_the_driver_read_back_as_the_rows_spark_writes(spark, tmp_path, name):
    ours, rows = ops_rows(str(tmp_path / "ours"))[name]
    theirs, _ = ops_rows(str(tmp_path / "theirs"))[name]
    for table in (ours, theirs):
        create_if_missing(spark, table)
    local_rows(spark, rows, theirs.schema).write.format("delta").mode("append").save(theirs.path)

    txn = Transaction(spark, ours.path)
    txn.commit_append(txn.write_rows(rows, ours.schema), "ours")

    def read(table: TableRef) -> list:
        return sorted(spark.read.format("delta").load(table.path).collect(), key=repr)

    assert read(ours) == read(theirs)
    # A file per partition.
    column = ours.schema.fieldNames().index(ours.partition_by[0])
    assert DeltaTable.forPath(spark, ours.path).detail().first().numFiles == len(
        {row[column] for row in rows}
    )


def test_a_driver_written_file_is_skipped_by_its_statistics(spark, tmp_path):
    history, _ = ops_rows(str(tmp_path))["watermark_history"]
    create_if_missing(spark, history)
    for batch in (3, 7):
        txn = Transaction(spark, history.path)
        row = ("p1", batch, 50, 1, 0, 0, 0, datetime(2026, 1, 1, tzinfo=UTC), None)
        txn.commit_append(txn.write_rows([row], history.schema), f"step {batch}")

    assert files_read(spark.read.format("delta").load(history.path).where("batch_id >= 5")) == 1
    assert files_read(spark.read.format("delta").load(history.path).where("batch_id >= 2")) == 2


def files_read(frame: DataFrame) -> int:
    """How many data files a query over ``frame`` read, once it has run."""
    frame.collect()
    leaves = frame._jdf.queryExecution().executedPlan().collectLeaves().iterator()
    read = 0
    while leaves.hasNext():
        metrics = leaves.next().metrics()
        if metrics.contains("numFiles"):
            read += metrics.get("numFiles").get().value()
    return read


def java_errors_converted(monkeypatch) -> list[str]:
    """The JVM exceptions PySpark converted into Python errors meanwhile (each costs
    tens of milliseconds: it is tested against every exception class PySpark and
    Delta know)."""
    converted: list[str] = []
    original = captured.convert_exception

    def convert_exception(error):
        converted.append(error.getClass().getName())
        return original(error)

    monkeypatch.setattr(captured, "convert_exception", convert_exception)
    return converted


def test_writing_and_committing_files_raises_no_java_error_on_the_way(spark, table, tmp_path, monkeypatch):
    history, steps = ops_rows(str(tmp_path))["watermark_history"]
    create_if_missing(spark, history)
    converted = java_errors_converted(monkeypatch)

    txn = Transaction(spark, table)
    written = txn.write(spark.createDataFrame([("b", 2, "open")], SCHEMA))
    txn.commit_append(written, "frame")
    driver_side = Transaction(spark, history.path)
    driver_side.commit_append(driver_side.write_rows(steps[:1], history.schema), "rows")

    assert converted == []
    assert len(written) == 1 and ("b", 2, "open") in rows(spark, table)


def test_an_append_under_a_transaction_id_is_recorded_and_seen_as_committed(spark, tmp_path):
    history, rows = ops_rows(str(tmp_path))["watermark_history"]
    create_if_missing(spark, history)
    txn = Transaction(spark, history.path)
    assert not txn.has_committed("step", 4)
    txn.commit_append(txn.write_rows(rows[:1], history.schema), "step", ("step", 4))

    again = Transaction(spark, history.path)
    assert again.has_committed("step", 4) and not again.has_committed("step", 5)


def history_with_steps(spark, root: str, *steps: tuple[str, int]) -> tuple[TableRef, list[tuple]]:
    """The watermark history table with one appended row under each transaction id of ``steps``."""
    history, rows = ops_rows(root)["watermark_history"]
    create_if_missing(spark, history)
    for step in steps:
        txn = Transaction(spark, history.path)
        txn.commit_append(txn.write_rows(rows[:1], history.schema), "step", step)
    return history, rows


def test_whether_a_transaction_id_committed_is_told_by_the_checksum_without_a_spark_job(spark, tmp_path):
    history, _ = history_with_steps(spark, str(tmp_path), ("step", 4), ("other", 9))
    txn = Transaction(spark, history.path)
    answers: list[tuple[bool, ...]] = []

    asked = [("step", 3), ("step", 4), ("step", 5), ("other", 9), ("unknown", 0)]
    assert jobs_run(spark, lambda: answers.append(tuple(txn.has_committed(*a) for a in asked))) == 0
    delta = Transaction(spark, history.path)._txn  # Delta's own lookup, through the table's state
    assert answers == [tuple(delta.txnVersion(app_id) >= version for app_id, version in asked)]
    assert answers == [(True, True, False, True, False)]


def test_without_a_checksum_whether_a_transaction_id_committed_is_told_by_the_tables_state(spark, tmp_path):
    history, _ = history_with_steps(spark, str(tmp_path), ("step", 4))
    for checksum in (Path(history.path) / "_delta_log").glob("*.crc"):
        checksum.unlink()
    java_class(spark, DELTA_LOG).clearCache()
    txn = Transaction(spark, history.path)
    assert txn.has_committed("step", 4) and not txn.has_committed("step", 5)


def test_a_commit_of_a_transaction_id_beside_one_that_looked_it_up_fails_the_later(spark, tmp_path):
    history, rows = history_with_steps(spark, str(tmp_path))
    looked = Transaction(spark, history.path)
    assert not looked.has_committed("step", 5)
    beside = Transaction(spark, history.path)
    beside.commit_append(beside.write_rows(rows[:1], history.schema), "step", ("step", 5))

    with pytest.raises(CONFLICTS):
        looked.commit_append(looked.write_rows(rows[:1], history.schema), "step", ("step", 5))
    assert spark.read.format("delta").load(history.path).count() == 1


def test_a_table_as_created_has_no_files_to_replace_and_no_state_is_rebuilt_to_say_so(spark, tmp_path):
    path = str(tmp_path / "created")
    assert Transaction(spark, path).create(SCHEMA, ["status"], {})
    txn = Transaction(spark, path)
    found: list[list] = []

    assert jobs_run(spark, lambda: found.append(txn.partition_files("status", IN_PLAY))) == 0
    assert found == [[]]


def written_in_two_versions(spark, path: str) -> str:
    rows = [("a", 1, "open"), ("z", 9, "closed")]
    spark.createDataFrame(rows, SCHEMA).write.format("delta").partitionBy("status").save(path)
    spark.createDataFrame([("b", 2, "open")], SCHEMA).write.format("delta").mode("append").save(path)
    return path


def open_files_by_delta(spark, path: str) -> list[str]:
    """The names of the files Delta's own read takes the open rows from."""
    frame = spark.read.format("delta").load(path).where("status = 'open'")
    return sorted(Path(row.file).name for row in frame.select(F.input_file_name().alias("file")).collect())


def test_a_partitions_files_are_found_in_the_checksums_list_without_a_spark_job(spark, tmp_path):
    path = written_in_two_versions(spark, str(tmp_path / "written"))
    txn = Transaction(spark, path)
    found: list = []

    assert jobs_run(spark, lambda: found.extend(txn.partition_files("status", IN_PLAY))) == 0
    assert sorted(Path(file.path()).name for file in found) == open_files_by_delta(spark, path)
    assert len(found) == 2


def test_without_a_checksum_a_partitions_files_are_found_in_the_tables_state(spark, tmp_path):
    path = written_in_two_versions(spark, str(tmp_path / "written"))
    for checksum in (Path(path) / "_delta_log").glob("*.crc"):
        checksum.unlink()
    java_class(spark, DELTA_LOG).clearCache()

    found = Transaction(spark, path).partition_files("status", IN_PLAY)
    assert sorted(Path(file.path()).name for file in found) == open_files_by_delta(spark, path)
    assert len(found) == 2


def test_a_small_tables_latest_rows_are_read_with_one_job_from_its_checksums_list(spark, tmp_path):
    path = written_in_two_versions(spark, str(tmp_path / "written"))
    read: list = []

    def latest() -> None:
        rows, version = read_latest(spark, path)
        read.extend(rows.collect())
        assert version == 1

    assert jobs_run(spark, latest) == 1
    by_delta = spark.read.format("delta").load(path)
    assert sorted(map(tuple, read)) == sorted(map(tuple, by_delta.collect()))
    assert list(read[0].asDict()) == by_delta.columns


def test_without_a_checksum_the_latest_rows_are_delta_reads_of_the_latest_version(spark, tmp_path):
    path = written_in_two_versions(spark, str(tmp_path / "written"))
    for checksum in (Path(path) / "_delta_log").glob("*.crc"):
        checksum.unlink()
    java_class(spark, DELTA_LOG).clearCache()

    rows, version = read_latest(spark, path)
    assert version == 1
    assert sorted(map(tuple, rows.collect())) == [("a", 1, "open"), ("b", 2, "open"), ("z", 9, "closed")]


def losing_write(spark, path: str, winner: str, attempts: list[int]):
    """A write of the open partition that another writer (labelled ``winner``) beats
    every time: it commits to that partition between the write's read and its commit."""

    def write() -> int:
        attempts.append(len(attempts) + 1)
        txn = Transaction(spark, path)
        txn.read_partitions("status", IN_PLAY)
        added = txn.write(spark.createDataFrame([("w", 1, "open")], SCHEMA))
        beside = Transaction(spark, path)
        beside.commit_append(beside.write(spark.createDataFrame([("x", 1, "open")], SCHEMA)), winner)
        return txn.commit_append(added, "loser")

    return write


def test_a_write_that_keeps_losing_gives_up_after_its_attempts_naming_the_writers_it_lost_to(spark, table):
    attempts: list[int] = []
    winner = batch_metadata("query-1", 7, {}, "silver")

    with pytest.raises(ConflictsExhausted) as lost:
        retry_on_conflict(
            losing_write(spark, table, winner, attempts), "test write", (spark, table), 3, pause_s=0
        )

    assert attempts == [1, 2, 3]
    assert "test write conflicted with concurrent writers 3 times" in str(lost.value)
    assert "the silver stream's batch 7" in str(lost.value)


def test_a_write_that_loses_to_the_stream_owning_the_work_hands_it_over(spark, table):
    attempts: list[int] = []
    winner = batch_metadata("query-1", 7, {}, "gold")

    handed = retry_on_conflict(
        losing_write(spark, table, winner, attempts), "test write", (spark, table), 3, pause_s=0, owner="gold"
    )

    assert handed is None and attempts == [1]
