"""Which commits between a read of the offline detector's state and a MERGE into it
make the MERGE's rows stale (``detector.merge_state``), on a tiny state table written
by the real delta-spark: a detector batch is stale after any other writer's commit, a
re-derivation only after a detector batch's."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from spark_jobs.config import load_pipeline
from spark_jobs.engine.detector import last_changes, merge_state, offline_tables, read_state
from spark_jobs.lakehouse.create import create_if_missing
from spark_jobs.lakehouse.log import table_version
from spark_jobs.tables import TableRegistry
from tests.integration.engine import jobs_run

pytestmark = pytest.mark.spark

PIPELINES = Path(__file__).resolve().parents[2] / "spark_jobs" / "pipelines"
KEY = ("device_id",)
NOW = datetime(2026, 1, 1, 1, 0, tzinfo=UTC)
BATCH, REDERIVATION = "a detector batch", "a re-derivation"


@pytest.fixture
def state(spark, tmp_path):
    registry = TableRegistry(load_pipeline(PIPELINES / "telemetry.yaml"), str(tmp_path))
    table = offline_tables(registry)[1]
    create_if_missing(spark, table)
    return table


def commit(spark, state, writer: str, device: str, read_version: int, txn_version: int = 0) -> bool:
    """``writer`` MERGEs a last row for ``device``, computed from the state read at
    ``read_version``; whether merge_state calls that read stale."""
    new_last = spark.createDataFrame(
        [(device, 1_000, "online")], "device_id string, ts_ms long, status string"
    )
    txn = ("offline-test", txn_version) if writer == BATCH else None
    return merge_state(spark, state, KEY, last_changes(KEY, new_last), txn, NOW, read_version)


def test_nothing_committed_between_the_read_and_the_merge_is_never_stale(spark, state):
    read = table_version(spark, state.path)
    assert not commit(spark, state, REDERIVATION, "a", read)
    read = table_version(spark, state.path)
    assert not commit(spark, state, BATCH, "a", read, txn_version=1)


def test_a_re_derivation_is_not_stale_after_another_re_derivation(spark, state):
    read = table_version(spark, state.path)
    assert not commit(spark, state, REDERIVATION, "a", read)
    assert not commit(spark, state, REDERIVATION, "a", read)


def test_a_re_derivation_is_stale_after_a_detector_batch(spark, state):
    read = table_version(spark, state.path)
    assert not commit(spark, state, BATCH, "b", read, txn_version=1)
    assert commit(spark, state, REDERIVATION, "a", read)


def test_a_detector_batch_is_stale_after_a_re_derivation(spark, state):
    read = table_version(spark, state.path)
    assert not commit(spark, state, REDERIVATION, "a", read)
    assert commit(spark, state, BATCH, "b", read, txn_version=1)


def test_a_re_derivation_is_stale_after_a_batch_even_when_re_derivations_came_between(spark, state):
    read = table_version(spark, state.path)
    assert not commit(spark, state, REDERIVATION, "a", read)
    assert not commit(spark, state, BATCH, "b", read + 1, txn_version=1)
    assert commit(spark, state, REDERIVATION, "a", read)


def test_the_state_is_read_at_its_latest_version_without_rebuilding_the_tables_state(spark, state):
    assert not commit(spark, state, BATCH, "a", table_version(spark, state.path), txn_version=1)
    assert not commit(spark, state, BATCH, "b", table_version(spark, state.path), txn_version=2)
    read: list = []

    assert jobs_run(spark, lambda: read.extend(read_state(spark, state).rows.collect())) == 1
    by_delta = spark.read.format("delta").load(state.path).collect()
    assert sorted(map(tuple, read)) == sorted(map(tuple, by_delta))
    assert {(row.kind, row.device_id) for row in read} >= {("last", "a"), ("last", "b")}
    assert read_state(spark, state).version == table_version(spark, state.path)
