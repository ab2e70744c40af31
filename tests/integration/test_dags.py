"""The DAGs: integrity (imports, owners, retries, tags, Params), and `dag.test()`
runs with real spark-submit over a small landing zone, reconciled exactly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from spark_jobs.config import load_pipeline
from spark_jobs.generator import FleetSpec, generate, write_landing
from spark_jobs.tables import TableRegistry

REPO = Path(__file__).resolve().parents[2]
DAG_IDS = {
    "tidemark_streaming",
    "tidemark_late_merge",
    "tidemark_idleness_check",
    "tidemark_backfill",
    "tidemark_maintenance",
    "tidemark_hourly_report",
}


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags"))


@pytest.fixture(scope="module")
def airflow_db():
    """dag.test() records its runs in Airflow's metadata database (SQLite here)."""
    subprocess.run(
        [str(Path(sys.executable).with_name("airflow")), "db", "migrate"], check=True, capture_output=True
    )


def test_every_dag_imports_without_errors(dagbag):
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == DAG_IDS


def test_every_dag_is_owned_tagged_and_retried_on_purpose(dagbag):
    for dag_id in DAG_IDS:
        dag = dagbag.dags[dag_id]
        assert "tidemark" in dag.tags, dag_id
        assert dag.doc_md, f"{dag_id} says what it does in the UI"
        assert dag.params["pipeline"] == "telemetry", dag_id
        for operator in dag.tasks:
            assert operator.owner == "tidemark", f"{dag_id}.{operator.task_id}"
            assert operator.retries is not None, f"{dag_id}.{operator.task_id}"


def test_stalled_streams_and_replays_are_not_retried_blindly_but_streams_are(dagbag):
    assert dagbag.dags["tidemark_idleness_check"].get_task("check_idle").retries == 0
    assert dagbag.dags["tidemark_backfill"].get_task("replay").retries == 0
    streaming = dagbag.dags["tidemark_streaming"]
    assert all(streaming.get_task(f"continuous.{job}").retries >= 3 for job in ("bronze", "silver"))


def test_the_late_merge_form_offers_dry_run_and_a_time_range(dagbag):
    params = dagbag.dags["tidemark_late_merge"].params
    assert {"pipeline", "dry_run", "from", "to"} <= set(params)
    assert params["dry_run"] is False


@pytest.mark.spark
@pytest.mark.slow
def test_streaming_then_late_merge_dag_runs_reconcile_exactly(
    dagbag, airflow_db, tmp_path, monkeypatch, spark
):
    monkeypatch.setenv("LAKEHOUSE_DIR", str(tmp_path))
    config = load_pipeline(REPO / "spark_jobs" / "pipelines" / "telemetry.yaml")
    registry = TableRegistry(config, str(tmp_path))
    fleet = generate(
        FleetSpec(
            devices=6, partitions=3, seed=2, duration_ms=30 * 60_000, late_ratio=0.05, malformed_ratio=0.02
        )
    )
    # Two scheduled runs, each draining what had landed: the second run's late
    # uploads find their windows already closed by the first run's watermark.
    half = len(fleet) // 2
    for part in (fleet[:half], fleet[half:]):
        write_landing(part, registry.landing_path, 300)
        run = dagbag.dags["tidemark_streaming"].test(run_conf={"mode": "available-now"})
        assert run.state == "success"
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["available_now.offline"] == "success" and states["continuous.bronze"] == "skipped"

    def count(path: str, where: str = "true") -> int:
        return spark.read.format("delta").load(path).where(where).count()

    bronze = count(registry.bronze.path)
    rejects = count(registry.ops["rejects"].path)
    assert bronze + rejects == len(fleet) and rejects > 0
    pending = count(registry.quarantine.path, "status = 'pending'")
    assert pending > 0

    run = dagbag.dags["tidemark_late_merge"].test(run_conf={"dry_run": False})
    assert run.state == "success"
    assert count(registry.quarantine.path, "status = 'merged'") == pending
    silver = (
        spark.read.format("delta")
        .load(registry.silver.path)
        .selectExpr("sum(record_count) - sum(late_merged_count) AS on_time", "sum(late_merged_count) AS late")
        .first()
    )
    assert silver.on_time + pending == bronze and silver.late == pending
