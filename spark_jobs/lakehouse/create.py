"""Creating a pipeline's tables: one commit each through a transaction of our own,
safe when two jobs race to create the same table."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from pyspark.sql import SparkSession

from spark_jobs.jvm import java_class
from spark_jobs.lakehouse.checkpoints import repair_command
from spark_jobs.lakehouse.commit_files import require_whole_commits
from spark_jobs.lakehouse.log import discard_unfinished_creation, has_commits
from spark_jobs.lakehouse.reachable import require_reachable
from spark_jobs.lakehouse.space import local_folder
from spark_jobs.tables import TableRef, TableRegistry

CREATE_ATTEMPTS = 4


# Held while tables are created in a local lakehouse (see ``creation_lock``).
CREATION_LOCK = ".tidemark-create.lock"


CREATION_THREADS = 4


# Delta lists a small table's files in each version's checksum, derived from the
# previous version's list, so that readers need not rebuild the table's state. For a
# new table it first rebuilds the state of the empty table before it (a Spark job
# each, most of what creating a table costs). With the listing off, a commit that
# leaves a table without files still writes its empty list: the same checksum, and
# later commits derive theirs from it.
ALL_FILES_IN_CHECKSUM = "spark.databricks.delta.allFilesInCrc.enabled"


@contextmanager
def no_file_listing_in_checksums(spark: SparkSession) -> Iterator[None]:
    """The listing off, for creations only, on the session Delta's commits read their
    settings from (the JVM's active one, which need not be ``spark``)."""
    conf = java_class(spark, "org.apache.spark.sql.SparkSession").active().conf()
    before = conf.get(ALL_FILES_IN_CHECKSUM) if conf.contains(ALL_FILES_IN_CHECKSUM) else None
    conf.set(ALL_FILES_IN_CHECKSUM, "false")
    try:
        yield
    finally:
        if before is None:
            conf.unset(ALL_FILES_IN_CHECKSUM)
        else:
            conf.set(ALL_FILES_IN_CHECKSUM, before)


@contextmanager
def creation_lock(root: str) -> Iterator[None]:
    """Serialise table creation among the jobs of one machine's lakehouse.

    Of two jobs creating the same table at the same instant, one commits version 0
    and the other fails with Delta's conflict; under the lock the second finds the
    table. Object stores are left to Delta's LogStore for their scheme."""
    folder = local_folder(root)
    if folder is None:
        yield
        return
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, CREATION_LOCK), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def create_if_missing(spark: SparkSession, table: TableRef) -> bool:
    """Idempotent, and safe when two jobs race to create the same table. One commit
    through a transaction of our own (:meth:`~spark_jobs.lakehouse.transaction.Transaction.create`):
    the builder API costs a few Spark jobs per table."""
    from spark_jobs.lakehouse.transaction import Transaction

    # Two jobs started together race to create the same tables: the loser's commit
    # fails (version 0 exists). Retrying re-reads the log and, finding the table, does nothing.
    for attempt in range(CREATE_ATTEMPTS):
        try:
            txn = Transaction(spark, table.path)
            return txn.create(table.schema, table.partition_by, table.table_properties)
        except Exception:
            if attempt == CREATE_ATTEMPTS - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
            discard_unfinished_creation(spark, table.path)
    return False


def create_missing(spark: SparkSession, registry: TableRegistry) -> list[TableRef]:
    """Create every table of ``registry`` that does not exist yet; returns the ones
    created. When they all exist (every start but the first) this costs a few file
    lookups a table and a read of its last commit file, and no Delta snapshot. A table
    whose last commit a crash of the machine damaged raises
    :class:`~spark_jobs.lakehouse.commit_files.DamagedCommits`; a lakehouse on object
    storage that cannot be reached is a :class:`~spark_jobs.config.ConfigError`; both
    before anything is written."""
    require_reachable(spark, registry.root)
    missing = [table for table in registry.all() if not has_commits(spark, table.path)]
    existing = [table.path for table in registry.all() if table not in missing]
    pipeline = registry.config.source_file or registry.config.name
    require_whole_commits(spark, existing, repair_command(pipeline, registry.root))
    if not missing:
        return []
    # Each creation is a Delta commit, mostly waiting: side by side.
    with (
        creation_lock(registry.root),
        no_file_listing_in_checksums(spark),
        ThreadPoolExecutor(CREATION_THREADS) as pool,
    ):
        created = list(pool.map(lambda table: create_if_missing(spark, table), missing))
    return [table for table, made in zip(missing, created, strict=True) if made]
