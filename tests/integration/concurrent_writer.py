"""A writer of the concurrent-commit test: its own JVM, which appends ``commits``
one-row commits to a table, each under the transaction id (its name, its commit's
number). The writers start each commit together, so that they race for one version
every time: a writer that has committed its n-th row creates ``<folder>/<name>.<n>``
and waits for every writer's before it starts the next.

``python -m tests.integration.concurrent_writer <table> <name> <commits> <folder> <writer>...``"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pyspark.sql.types import LongType, StringType, StructField, StructType

from spark_jobs.lakehouse.transaction import Transaction
from spark_jobs.session import build_session

SCHEMA = StructType([StructField("writer", StringType()), StructField("n", LongType())])


def wait_for(marks: list[Path]) -> None:
    while not all(mark.exists() for mark in marks):
        time.sleep(0.0005)


def main(table: str, name: str, commits: int, folder: Path, writers: list[str]) -> None:
    spark = build_session(
        f"tidemark-writer-{name}", master="local[1]", overrides={"spark.ui.enabled": "false"}
    )
    (folder / f"{name}.ready").touch()
    wait_for([folder / f"{writer}.ready" for writer in writers])
    for n in range(commits):
        txn = Transaction(spark, table)
        txn.commit_append(txn.write_rows([(name, n)], SCHEMA), f"{name}-{n}", (name, n))
        (folder / f"{name}.{n}").touch()
        wait_for([folder / f"{writer}.{n}" for writer in writers])
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]), sys.argv[5:])
