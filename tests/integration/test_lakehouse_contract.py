"""What Tidemark relies on in Delta's and Spark's private APIs, pinned one behaviour a
test, so that an upgrade of delta-spark fails here, by name, rather than in a pipeline.
The storage layer (``spark_jobs.lakehouse``) is their only user. More of its contract is
pinned beside the code that uses it: tests/integration/test_lakehouse_transaction.py
(``DeltaOperations.Write`` commits, the checksum's transaction ids, ``writeFiles``, driver
files), and tests/unit/test_parse.py (Spark's ``JsonToStructs`` behind ``FromJson``). The
last test here is the storage layer's own: Hadoop's file listing as it deletes archives."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from spark_jobs.jvm import java_class
from spark_jobs.lakehouse.files import delete_older_than
from spark_jobs.lakehouse.log import commits, table_version
from spark_jobs.lakehouse.transaction import CONFLICTS, Transaction
from spark_jobs.tables import LOG_RETENTION, REMOVED_FILES_RETENTION

pytestmark = pytest.mark.spark

SCHEMA = StructType(
    [StructField("key", StringType()), StructField("n", LongType()), StructField("status", StringType())]
)


@pytest.fixture
def path(spark, tmp_path) -> str:
    table = str(tmp_path / "table")
    assert Transaction(spark, table).create(SCHEMA, ["status"], {})
    return table


def append(spark, path: str, rows: list[tuple], label: str = "append") -> None:
    txn = Transaction(spark, path)
    txn.commit_append(txn.write_rows(rows, SCHEMA), label)


def test_a_checksum_lists_a_tables_files_up_to_fifty_of_them(spark, path):
    # Delta's allFilesInCrc.thresholdNumFiles: readers that take the list from the
    # checksum fall back to the table's state beyond it.
    for index in range(50):
        append(spark, path, [(f"k{index}", index, "closed")])
    assert len(Transaction(spark, path).listed_files()) == 50
    append(spark, path, [("k50", 50, "closed")])
    assert Transaction(spark, path).listed_files() is None


def overwrite_of(spark, path: str, status: str) -> Transaction:
    """A transaction that has read partition ``status`` and replaces its files with a row."""
    txn = Transaction(spark, path)
    txn.read_partitions("status", frozenset({status}))
    txn.replaced = txn.partition_files("status", frozenset({status}))
    txn.added = txn.write_rows([("new", 0, status)], SCHEMA)
    return txn


def test_a_read_partition_conflicts_with_a_blind_append_to_it_and_not_to_another(spark, path):
    # Delta's default isolation (Serializable) checks blind appends against what a
    # rewrite read: why the merge declares the files it rewrites and nothing more.
    append(spark, path, [("p", 1, "pending"), ("c", 1, "closed")])
    same, other = overwrite_of(spark, path, "pending"), overwrite_of(spark, path, "closed")
    append(spark, path, [("a", 1, "pending")])
    with pytest.raises(CONFLICTS):
        same.commit_overwrite(same.added, same.replaced, "status = 'pending'", "same")
    other.commit_overwrite(other.added, other.replaced, "status = 'closed'", "other")


def test_read_files_conflict_with_their_removal_and_with_no_append(spark, path):
    append(spark, path, [("a", 1, "pending")])
    reader = Transaction(spark, path)
    (file,) = reader.listed_files()
    reader.read_files([file])
    append(spark, path, [("b", 2, "pending")])
    remover = Transaction(spark, path)
    (removed,) = [f for f in remover.listed_files() if f.path() == file.path()]
    remover.commit_overwrite([], [removed], "status = 'pending'", "remove")
    with pytest.raises(CONFLICTS):
        reader.commit_overwrite([], [file], "status = 'pending'", "reader")

    appended_beside = Transaction(spark, path)
    (kept,) = [f for f in appended_beside.listed_files() if f.path() != file.path()]
    appended_beside.read_files([kept])
    append(spark, path, [("c", 3, "pending")])
    appended_beside.commit_overwrite([], [kept], "status = 'pending'", "beside")


def test_files_for_a_condition_are_pruned_by_partition_and_by_every_equality_of_a_disjunction(spark, path):
    for index in range(4):
        append(spark, path, [(f"k{index}", 10 * index, "closed")])
    append(spark, path, [("k9", 10, "open")])
    txn = Transaction(spark, path)

    found = txn.files_where("status = 'closed' AND (n = 10 OR n = 30)")

    rows = txn.frame(found).orderBy("n").collect()
    assert [(row.key, row.n, row.status) for row in rows] == [("k1", 10, "closed"), ("k3", 30, "closed")]
    assert txn._txn.readPredicates().isEmpty() and txn._txn.readFiles().isEmpty()


def test_a_commits_label_and_operation_are_read_from_the_log_without_a_spark_job(spark, path):
    append(spark, path, [("a", 1, "open")], label="tidemark-test:1")

    (commit,) = commits(spark, path, table_version(spark, path), table_version(spark, path))

    assert (commit.user_metadata, commit.operation) == ("tidemark-test:1", "WRITE")


def test_files_older_than_a_moment_are_deleted_at_any_depth_and_newer_ones_kept(spark, tmp_path):
    old, new = tmp_path / "a" / "b" / "old.json", tmp_path / "a" / "new.json"
    old.parent.mkdir(parents=True)
    old.write_text("{}")
    new.write_text("{}")
    os.utime(old, (1_000, 1_000))

    assert delete_older_than(spark, str(tmp_path / "a"), 2_000_000) == 1
    assert not old.exists() and new.exists()
    assert delete_older_than(spark, str(tmp_path / "missing"), 2_000_000) == 0


def retained_table(spark, tmp_path, name: str, checkpoint_interval: int) -> tuple[str, Path]:
    table = str(tmp_path / name)
    properties = dict(
        (LOG_RETENTION, REMOVED_FILES_RETENTION, ("delta.checkpointInterval", str(checkpoint_interval)))
    )
    assert Transaction(spark, table).create(SCHEMA, ["status"], properties)
    return table, tmp_path / name / "_delta_log"


def age_log(log: Path, seconds: float) -> None:
    """Every entry of the log made ``seconds`` old, a second apart in the order of their
    versions, as a live log's are (Delta takes files with equal times as clock skew and
    keeps them)."""
    start = time.time() - seconds
    for second, entry in enumerate(sorted(log.iterdir())):
        os.utime(entry, (start + second, start + second))


def test_commits_older_than_the_log_retention_to_the_hour_leave_the_log_at_the_next_checkpoint(
    spark, tmp_path
):
    # Tidemark's tables keep an hour of commits (tables.LOG_RETENTION), so that a listing
    # of the log of a stream that commits every second stays short. Delta's own cleanup
    # rounds its cutoff down to midnight, so from 02:00 UTC on, commits three hours old
    # stay unless the storage layer's cleanup to the hour runs; either deletes only the
    # commits before a checkpoint that is itself past the retention.
    table, log = retained_table(spark, tmp_path, "retained", checkpoint_interval=3)
    for key in "abc":
        append(spark, table, [(key, 1, "open")])
    age_log(log, 3 * 3_600)

    for key in "def":
        append(spark, table, [(key, 1, "open")])

    commits_left = sorted(entry.name for entry in log.glob("*.json"))
    assert commits_left[0] == "00000000000000000003.json", commits_left
    assert spark.read.format("delta").load(table).count() == 6


def test_commits_within_the_log_retention_stay_past_a_checkpoint(spark, tmp_path):
    table, log = retained_table(spark, tmp_path, "recent", checkpoint_interval=3)
    for key in "abc":
        append(spark, table, [(key, 1, "open")])
    age_log(log, 60)

    for key in "def":
        append(spark, table, [(key, 1, "open")])

    assert (log / "00000000000000000000.json").exists()
    assert spark.read.format("delta").load(table).count() == 6


def test_a_logs_listing_from_a_version_is_what_deltas_own_store_lists_with_a_status_per_entry_listed(
    spark, tmp_path
):
    # The file: scheme's log store (posix_fs.LOG_STORE_CONF) reads the folder's names and
    # asks the status of those from the version listed; Delta's asks every entry's.
    table, log = retained_table(spark, tmp_path, "listed", checkpoint_interval=3)
    for key in "abcdefg":
        append(spark, table, [(key, 1, "open")])
    hadoop_path = java_class(spark, "org.apache.hadoop.fs.Path")
    configuration = spark._jsc.hadoopConfiguration()
    store = java_class(spark, "io.tidemark.fs.LocalLogStore")

    def listed(log_store, version: int) -> list[tuple[str, int, int]]:
        found = log_store.listFrom(hadoop_path(f"file:{log}/{version:020d}.json"), configuration)
        statuses = []
        while found.hasNext():
            status = found.next()
            statuses.append((status.getPath().toString(), status.getLen(), status.getModificationTime()))
        return statuses

    names_first = store(configuration)
    deltas_own = java_class(spark, "io.delta.storage.HDFSLogStore")(configuration)
    for version in (0, 3, 6, 7):
        statuses_before = store.statuses()
        assert listed(names_first, version) == listed(deltas_own, version)
        asked = store.statuses() - statuses_before
        entries_from_version = [name for name in os.listdir(log) if name >= f"{version:020d}.json"]
        assert asked == len(entries_from_version)
    # And it is the store Delta lists a file: table's log through.
    listings_before = store.listings()
    append(spark, table, [("h", 1, "open")])
    assert table_version(spark, table) == 8
    assert store.listings() > listings_before
