"""The DAGs' integrity: imports, owners, retries, tags, Params. Their runs with real
spark-submit are in test_airflow_e2e.py (REST-triggered under `airflow standalone`),
test_airflow_soak.py and test_spark_cluster.py (`dag.test()` on a Spark cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest

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
    assert all(streaming.get_task(f"continuous.{job}").retries >= 3 for job in ("pipeline", "bronze"))


def test_the_streams_run_as_one_application_unless_asked_to_scale_out(dagbag):
    choose = dagbag.dags["tidemark_streaming"].get_task("choose_mode").python_callable
    one, alone = {"one_application": True}, {"one_application": False}
    assert choose(params={"mode": "available-now", **one}) == ["available_now.pipeline"]
    assert choose(params={"mode": "continuous", **one}) == ["continuous.pipeline"]
    assert choose(params={"mode": "available-now", **alone}) == ["available_now.bronze"]
    assert choose(params={"mode": "continuous", **alone}) == [
        f"continuous.{job}" for job in ("bronze", "silver", "gold", "offline")
    ]
    assert dagbag.dags["tidemark_streaming"].params["one_application"] is True


def test_the_late_merge_form_offers_dry_run_and_a_time_range(dagbag):
    params = dagbag.dags["tidemark_late_merge"].params
    assert {"pipeline", "dry_run", "from", "to"} <= set(params)
    assert params["dry_run"] is False
