"""A micro-batch costs what its records cost, however many commits and files lie
behind it (DESIGN §4b): the Spark jobs of a step and the log entries its listings
stat, counted batch after batch while the tables' histories grow past what Delta
lists in a checksum and past log checkpoints."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from spark_jobs import tables
from spark_jobs.engine.gold_store import changed_keys, refresh_gold
from spark_jobs.jvm import java_class
from spark_jobs.lakehouse.create import create_missing
from spark_jobs.lakehouse.writes import session_settings
from spark_jobs.tables import TableRegistry
from tests.benchmarks.bench import append, closed_windows, history_records
from tests.integration.conftest import registry_for, write_pipeline
from tests.integration.engine import jobs_run

pytestmark = pytest.mark.spark

# Delta lists a table's files in its checksum up to this many (lowered here from 50,
# so that a few dozen commits pass it); past it, a reader that needs the files must
# rebuild the table's state from the log for every new version, a Spark job.
CHECKSUM_FILES_LIMIT = {"spark.databricks.delta.allFilesInCrc.thresholdNumFiles": "8"}
# A log checkpoint every this many commits (lowered from 100), so that the batches
# pass several: a listing stats the entries from the last checkpoint on.
CHECKPOINT_INTERVAL = ("delta.checkpointInterval", "5")
BATCHES = 24


def test_a_gold_refresh_costs_no_more_spark_jobs_nor_log_statuses_after_dozens_of_commits_than_after_a_few(
    spark, tmp_path, monkeypatch
):
    monkeypatch.setattr(tables, "LOG_CHECKPOINT_INTERVAL", CHECKPOINT_INTERVAL)
    registry: TableRegistry = registry_for(write_pipeline(tmp_path), tmp_path / "lakehouse")
    config = registry.config
    create_missing(spark, registry)
    log_store = java_class(spark, "io.tidemark.fs.LocalLogStore")
    jobs, statuses = [], []
    with session_settings(spark, CHECKSUM_FILES_LIMIT):
        for minute in range(BATCHES):
            statuses_before = log_store.statuses()
            # A batch of the silver stream closing a minute's windows: one more file.
            closed = closed_windows(
                config, history_records(spark, config, minute, minute + 1), datetime.now(UTC)
            )
            append(closed, registry.silver)
            keys = changed_keys(closed, registry)
            jobs.append(
                jobs_run(
                    spark, lambda keys=keys: refresh_gold(spark, registry, keys, datetime.now(UTC), "refresh")
                )
            )
            statuses.append(log_store.statuses() - statuses_before)
    early, late = slice(1, 8), slice(-8, None)
    assert max(jobs[late]) <= max(jobs[early]), f"Spark jobs per refresh, batch by batch: {jobs}"
    # From the first checkpoint on, a listing stats what follows the last checkpoint;
    # Delta's own store stats every entry of the log, two more a commit.
    after_first_checkpoint = slice(5, 13)
    assert 0 < max(statuses[late]) <= max(statuses[after_first_checkpoint]), (
        f"log statuses a batch: {statuses}"
    )
