"""Delta transactions Tidemark drives itself (``spark_jobs.delta_txn``): a partition
writer that names the files it replaces, and tables created by one commit. Each
outcome is checked against what Delta's own APIs say of the table."""

from __future__ import annotations

import pytest
from delta.tables import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from spark_jobs.delta_txn import PartitionWriter, Transaction
from spark_jobs.jobs.common import CONFLICTS
from spark_jobs.tables import TableRef, create_if_missing

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
    original = Transaction.files_where

    def files_where(self, condition: str):
        asked.append(condition)
        return original(self, condition)

    monkeypatch.setattr(Transaction, "files_where", files_where)
    return asked


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


def test_a_change_by_another_writer_to_the_partitions_makes_the_writer_ask_again(spark, table, monkeypatch):
    asked = counting_state_reads(monkeypatch)
    writer = PartitionWriter(table, "status", IN_PLAY)
    writer.overwrite(spark, add_one, "w:1")

    DeltaTable.forPath(spark, table).update(F.col("key") == "a", {"total": F.lit(100)})
    writer.overwrite(spark, add_one, "w:2")

    # Nothing doubled: the row the other writer rewrote is read from its file, once.
    assert rows(spark, table) == [("a", 101, "open"), ("z", 9, "closed")]
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


@pytest.mark.parametrize(
    "other_writer",
    [
        lambda spark, path: (
            spark.createDataFrame([("c", 3, "open")], SCHEMA)
            .write.format("delta")
            .mode("overwrite")
            .option("replaceWhere", "status = 'open'")
            .save(path)
        ),
        lambda spark, path: DeltaTable.forPath(spark, path).update(F.col("key") == "z", {"total": F.lit(10)}),
    ],
    ids=["replaces the writer's partitions", "rewrites another partition"],
)
def test_a_commit_that_lands_during_the_overwrite_fails_it_with_a_delta_conflict(spark, table, other_writer):
    writer = PartitionWriter(table, "status", IN_PLAY)

    def racing(current: DataFrame) -> DataFrame:
        other_writer(spark, table)
        return add_one(current)

    with pytest.raises(CONFLICTS):
        writer.overwrite(spark, racing, "w:1")
    assert writer.kept is None
    writer.overwrite(spark, add_one, "w:2")
    assert sum(1 for row in rows(spark, table) if row[2] == "open") == 1


def test_a_created_table_has_the_protocol_schema_partitions_and_properties_of_a_built_one(spark, tmp_path):
    properties = (("delta.enableChangeDataFeed", "true"), ("delta.dataSkippingStatsColumns", "key"))
    built = str(tmp_path / "built")
    builder = DeltaTable.create(spark).location(built).addColumns(SCHEMA).partitionedBy("status")
    for key, value in properties:
        builder = builder.property(key, value)
    builder.execute()
    ours = TableRef("test", "ours", str(tmp_path / "ours"), SCHEMA, ("status",), properties)

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


def test_creating_a_table_that_exists_writes_nothing(spark, table):
    before = DeltaTable.forPath(spark, table).history().count()

    assert not create_if_missing(spark, TableRef("test", "t", table, SCHEMA, ("status",)))
    assert DeltaTable.forPath(spark, table).history().count() == before
