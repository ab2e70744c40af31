"""A process's view of a table's files, followed through the log: checked against
the files Delta's own reads take rows from."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from spark_jobs.lakehouse.table_files import TableFiles, Within, files_within, read_latest, rewrite_within
from spark_jobs.lakehouse.transaction import CONFLICTS, Transaction
from spark_jobs.lakehouse.writes import session_settings
from tests.integration.engine import jobs_run

CHECKSUM_FILES_LIMIT = "spark.databricks.delta.allFilesInCrc.thresholdNumFiles"

pytestmark = pytest.mark.spark

SCHEMA = StructType(
    [
        StructField("key", StringType(), False),
        StructField("at", TimestampType(), False),
        StructField("total", LongType(), False),
    ]
)
START = datetime(2026, 1, 1, tzinfo=UTC)


def hour(offset: int) -> datetime:
    return START + timedelta(hours=offset)


def append(spark, path: str, rows: list[tuple], files: int = 1) -> None:
    spark.createDataFrame(rows, SCHEMA).repartition(files).write.format("delta").mode("append").save(path)


def files_by_delta(spark, path: str) -> list[str]:
    """The names of the files Delta's own read of the latest version takes rows from."""
    frame = spark.read.format("delta").load(path).select(F.input_file_name().alias("file"))
    return sorted({Path(row.file).name for row in frame.collect()})


def names(files) -> list[str]:
    return sorted(Path(file.action.path()).name for file in files)


@pytest.fixture(scope="module")
def many_files_made(spark, tmp_path_factory) -> Path:
    """A table of more files than Delta's checksum lists, one row per file, each its
    own commit, as a stream's (Delta lists them all after a commit of many); the
    list's limit lowered to make it in a few commits."""
    path = str(tmp_path_factory.mktemp("many") / "table")
    assert Transaction(spark, path).create(SCHEMA, [], {})
    with session_settings(spark, {CHECKSUM_FILES_LIMIT: "4"}):
        for index in range(6):
            txn = Transaction(spark, path)
            txn.commit_append(txn.write_rows([(f"k{index}", hour(index), index)], SCHEMA), "a row")
    return Path(path)


@pytest.fixture
def many_files(many_files_made, tmp_path) -> str:
    """A copy of that table of its own (its log names its files by relative paths)."""
    return str(shutil.copytree(many_files_made, tmp_path / "many"))


def test_the_files_of_a_table_past_its_checksums_list_are_those_delta_reads(spark, many_files):
    assert Transaction(spark, many_files).listed_files() is None

    found = TableFiles(many_files).at(Transaction(spark, many_files))
    assert names(found) == files_by_delta(spark, many_files)


@pytest.mark.parametrize(
    "other_writer",
    [
        lambda spark, path: append(spark, path, [("new", hour(1), 1)]),
        lambda spark, path: spark.sql(f"DELETE FROM delta.`{path}` WHERE total < 3"),
        lambda spark, path: spark.sql(f"OPTIMIZE delta.`{path}`"),
    ],
    ids=["an append", "a delete of some files", "a compaction"],
)
def test_another_writers_commit_is_followed_through_the_log_without_a_spark_job(
    spark, many_files, other_writer
):
    view = TableFiles(many_files)
    view.at(Transaction(spark, many_files))
    other_writer(spark, many_files)
    txn = Transaction(spark, many_files)
    found: list = []

    assert jobs_run(spark, lambda: found.extend(view.at(txn))) == 0
    assert names(found) == files_by_delta(spark, many_files)


def test_a_table_made_again_at_its_path_is_read_anew(spark, many_files):
    view = TableFiles(many_files)
    view.at(Transaction(spark, many_files))
    shutil.rmtree(many_files)
    for index in range(3):
        append(spark, many_files, [(f"again{index}", hour(index), index)])

    assert names(view.at(Transaction(spark, many_files))) == files_by_delta(spark, many_files)


@pytest.fixture
def hours_apart(spark, tmp_path) -> str:
    """A table of three files: rows at hours 0-1, at hour 5, and at hour 9."""
    path = str(tmp_path / "hours")
    append(spark, path, [("a", hour(0), 1), ("b", hour(1), 2)])
    append(spark, path, [("c", hour(5), 3)])
    append(spark, path, [("d", hour(9), 4)])
    return path


@pytest.mark.parametrize(
    ("low", "high", "keys"),
    [
        (4, 6, {"c"}),
        (5, 6, {"c"}),
        (2, 5, set()),
        (1, 9, {"a", "b", "c"}),
        (0, 24, {"a", "b", "c", "d"}),
    ],
    ids=["around one file", "from a file's lowest", "up to a file's lowest", "from a file's highest", "all"],
)
def test_only_the_files_whose_statistics_allow_rows_in_a_range_are_read(spark, hours_apart, low, high, keys):
    rows, version = read_latest(spark, hours_apart, Within("at", hour(low), hour(high)))

    assert version == 2
    assert {row.key for row in rows.collect()} == keys


def test_a_range_with_no_files_reads_no_rows(spark, hours_apart):
    txn = Transaction(spark, hours_apart)

    assert files_within(txn, Within("at", hour(10), hour(20))) == []


def rows(spark, path: str) -> list[tuple]:
    return sorted((row.key, row.total) for row in spark.read.format("delta").load(path).collect())


def doubled(current: DataFrame) -> DataFrame:
    return current.withColumn("total", F.col("total") * 2)


def test_a_rewrite_within_a_range_replaces_the_rows_of_the_files_there_and_no_others(spark, hours_apart):
    assert rewrite_within(spark, hours_apart, Within("at", hour(5), hour(6)), doubled, "doubling")

    assert rows(spark, hours_apart) == [("a", 1), ("b", 2), ("c", 6), ("d", 4)]


def test_a_rewrite_under_a_committed_transaction_id_writes_nothing(spark, hours_apart):
    within = Within("at", hour(5), hour(6))
    assert rewrite_within(spark, hours_apart, within, doubled, "doubling", ("doubler", 1))

    assert not rewrite_within(spark, hours_apart, within, doubled, "doubling", ("doubler", 1))
    assert rows(spark, hours_apart) == [("a", 1), ("b", 2), ("c", 6), ("d", 4)]


def test_an_append_anywhere_during_a_rewrite_fails_it_and_the_rewrite_writes_nothing(spark, hours_apart):
    def racing(current: DataFrame) -> DataFrame:
        append(spark, hours_apart, [("e", hour(20), 5)])
        return doubled(current)

    with pytest.raises(CONFLICTS):
        rewrite_within(spark, hours_apart, Within("at", hour(5), hour(6)), racing, "doubling")
    assert rows(spark, hours_apart) == [("a", 1), ("b", 2), ("c", 3), ("d", 4), ("e", 5)]
