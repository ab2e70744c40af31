"""The DAGs' integrity: imports, owners, retries, tags, Params. Their runs with real
spark-submit are in test_production_rehearsal.py (REST-triggered under `airflow
standalone`, on a Spark cluster, over S3), test_live_demo.py (from the page) and
test_spark_cluster.py (`dag.test()` on a Spark cluster); the sensor's in test_airflow_e2e.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

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


def test_every_task_merges_included_waits_the_deployments_retry_delay_between_tries(dagbag):
    from datetime import timedelta

    from airflow.configuration import conf

    deployments = timedelta(seconds=conf.getint("core", "default_task_retry_delay"))
    for dag_id in ("tidemark_streaming", "tidemark_late_merge"):
        assert {task.retry_delay for task in dagbag.dags[dag_id].tasks} == {deployments}, dag_id


def test_every_spark_batch_task_has_a_deadline_and_no_stream_has_one(dagbag):
    from airflow.sdk.definitions.mappedoperator import MappedOperator
    from tidemark_airflow.operators import SupervisedStreamOperator, TidemarkJobOperator

    def deadline(task):  # a mapped task's arguments are only its partial ones until it runs
        return (
            task.partial_kwargs.get("execution_timeout")
            if isinstance(task, MappedOperator)
            else task.execution_timeout
        )

    def kind(task):
        return task.operator_class if isinstance(task, MappedOperator) else type(task)

    tasks = [task for dag in dagbag.dags.values() for task in dag.tasks]
    jobs = [task for task in tasks if issubclass(kind(task), TidemarkJobOperator)]
    streams = [task for task in jobs if issubclass(kind(task), SupervisedStreamOperator)]
    assert streams and all(deadline(task) is None for task in streams)
    batches = [task for task in jobs if task not in streams]
    assert any(isinstance(task, MappedOperator) for task in batches)
    assert len(batches) >= 9 and all(deadline(task) for task in batches), [
        task.task_id for task in batches if not deadline(task)
    ]


def test_the_merges_time_range_is_picked_as_dates_and_times(dagbag):
    params = dagbag.dags["tidemark_late_merge"].params
    for name in ("from", "to"):
        assert params.get_param(name).schema["format"] == "date-time", name
        assert params[name] is None, f"{name}: no range by default"


class Runs:
    """What ``choose_mode`` asks Airflow: its run's type, and how many runs are queued."""

    def __init__(self, run_type: str, queued: int) -> None:
        self.dag_run = SimpleNamespace(dag_id="tidemark_streaming", run_type=run_type)
        self.queued = queued

    def get_dr_count(self, dag_id: str, states: list[str]) -> int:
        assert dag_id == "tidemark_streaming"
        return self.queued if states == ["queued"] else 0


def choose_mode(dagbag, params: dict, runs: Runs):
    choose = dagbag.dags["tidemark_streaming"].get_task("choose_mode").python_callable
    return choose(params=params, dag_run=runs.dag_run, ti=runs)


def test_the_streams_run_as_one_application_unless_asked_to_scale_out(dagbag):
    one, alone, triggered = {"one_application": True}, {"one_application": False}, Runs("manual", 0)
    assert choose_mode(dagbag, {"mode": "available-now", **one}, triggered) == ["available_now.pipeline"]
    assert choose_mode(dagbag, {"mode": "continuous", **one}, triggered) == ["continuous.pipeline"]
    assert choose_mode(dagbag, {"mode": "available-now", **alone}, triggered) == ["available_now.bronze"]
    assert choose_mode(dagbag, {"mode": "continuous", **alone}, triggered) == [
        f"continuous.{job}" for job in ("bronze", "silver", "gold", "offline")
    ]


def test_every_streaming_job_runs_under_the_profile_its_run_chose_or_the_workers(dagbag):
    from tidemark_airflow.operators import TidemarkJobOperator

    dag = dagbag.dags["tidemark_streaming"]
    jobs = [task for task in dag.tasks if isinstance(task, TidemarkJobOperator)]
    assert len(jobs) == 10 and dag.params["jvm_profile"] is None
    for chosen, rendered in ((None, ""), ("throughput", "throughput")):
        context = {"params": {"jvm_profile": chosen}}
        assert {task.render_template(task.jvm_profile, context) for task in jobs} == {rendered}


def test_a_scheduled_pass_gives_way_to_a_triggered_run_queued_behind_it(dagbag):
    scheduled = {"mode": "available-now", "one_application": True}
    assert choose_mode(dagbag, scheduled, Runs("scheduled", 1)) is None
    assert choose_mode(dagbag, scheduled, Runs("scheduled", 0)) == ["available_now.pipeline"]
    # A triggered run never gives way: it is the one the others wait for.
    assert choose_mode(dagbag, {"mode": "continuous", "one_application": True}, Runs("manual", 1)) == [
        "continuous.pipeline"
    ]
    assert dagbag.dags["tidemark_streaming"].params["one_application"] is True


def test_the_late_merge_form_offers_dry_run_and_a_time_range(dagbag):
    params = dagbag.dags["tidemark_late_merge"].params
    assert {"pipeline", "dry_run", "from", "to"} <= set(params)
    assert params["dry_run"] is False


def test_the_late_merge_runs_on_the_quarantine_asset_or_a_clock_behind_a_backlog_gate(dagbag):
    from airflow.sdk import AssetOrTimeSchedule

    dag = dagbag.dags["tidemark_late_merge"]
    assert isinstance(dag.timetable, AssetOrTimeSchedule)
    assert dag.timetable.asset_condition.name == "tidemark_quarantine"
    assert dag.timetable.timetable.expression == "*/5 * * * *"
    assert dag.params["min_pending"] == 25
    # A merge per pipeline due: the gate's list maps the arguments, and they map the merges.
    assert dag.get_task("merge_arguments").upstream_task_ids == {"pipelines_to_merge"}
    assert dag.get_task("merge_late").upstream_task_ids == {"merge_arguments"}


def test_a_late_merge_someone_triggers_merges_its_pipeline_whatever_waits(dagbag):
    choose = dagbag.dags["tidemark_late_merge"].get_task("pipelines_to_merge").python_callable
    manual = SimpleNamespace(run_type="manual", logical_date=None)
    # No lakehouse is read: the pipeline asked for is merged, even with nothing waiting.
    assert choose(params={"pipeline": "clickstream", "min_pending": 25}, dag_run=manual) == ["clickstream"]
    streaming = dagbag.dags["tidemark_streaming"]
    for task_id in ("available_now.silver", "available_now.pipeline"):
        assert "tidemark_quarantine" in [asset.name for asset in streaming.get_task(task_id).outlets], task_id
