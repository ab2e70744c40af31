"""Under a real `airflow standalone` on its embedded default (SQLite): the
WatermarkSensor waits in the triggerer until the watermark passes its hour, across a
crash and restart of the scheduler and the triggerer. DAG runs
that run the jobs through spark-submit, triggered through the REST API, are in
test_production_rehearsal.py (on PostgreSQL) and test_live_demo.py (from the page)."""

from __future__ import annotations

import urllib.error
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from tidemark_airflow.standalone import Airflow, wait

from spark_jobs.config import load_pipeline
from spark_jobs.engine.watermark_steps import flush
from spark_jobs.generator import START_MS
from spark_jobs.tables import TableRegistry
from tests.integration.airflow_standalone import airflow_standalone, restart_component

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PIPELINE = REPO / "spark_jobs" / "pipelines" / "telemetry.yaml"


@pytest.fixture(scope="module")
def lakehouse(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("e2e-lakehouse")


@pytest.fixture(scope="module")
def standalone(tmp_path_factory, lakehouse):
    settings = {
        # The sensor's trigger reads the watermark every few seconds, not every minute:
        # the test waits for the poll after the flush.
        "AIRFLOW__TIDEMARK__WATERMARK_POKE_INTERVAL": "3",
        # A dead triggerer's triggers go to a live one once its heartbeat is this old.
        "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "10",
    }
    with airflow_standalone(tmp_path_factory.mktemp("e2e-airflow"), lakehouse, settings) as started:
        yield started
    assert started.leftovers == [], "Airflow left processes behind"


def task_state(airflow: Airflow, dag_id: str, run_id: str, task_id: str) -> str | None:
    path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
    try:
        return airflow.request("GET", path)["state"]
    except urllib.error.HTTPError as error:
        if error.code == 404:  # a run not scheduled yet has no task instances
            return None
        raise


def trigger_logs(home: Path, dag_id: str, run_id: str, task_id: str) -> dict[int, str]:
    """A deferred task's trigger logs, by the id of the triggerer job that ran its trigger."""
    folder = home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
    logs = folder.glob("attempt=*.log.trigger.*.log")
    return {int(path.name.split(".")[-2]): path.read_text() for path in logs}


def test_the_watermark_sensor_waits_in_the_triggerer_until_the_watermark_passes_its_hour_across_restarts(
    standalone, lakehouse, spark
):
    airflow = standalone.client
    registry = TableRegistry(load_pipeline(PIPELINE), str(lakehouse))
    dag_id, sensor = "tidemark_hourly_report", "hour_complete_in_event_time"
    airflow.wait_for_dags([dag_id])
    # The hour before a moment far beyond the fleets' event times: not complete yet.
    hour_end = datetime.fromtimestamp(START_MS / 1000, UTC) + timedelta(hours=10)
    mine = airflow.trigger(dag_id, {"pipeline": "telemetry"}, logical_date=hour_end)
    airflow.unpause(dag_id)  # which also schedules the last hour before now: it waits as well

    def deferred_run() -> str | None:
        listed = airflow.request("GET", f"/api/v2/dags/{dag_id}/dagRuns")["dag_runs"]
        runs = [run["dag_run_id"] for run in listed]
        return next((run for run in runs if task_state(airflow, dag_id, run, sensor) == "deferred"), None)

    # Deferred: the sensor's trigger polls in the triggerer, and no worker slot is held.
    wait(lambda: deferred_run() is not None, 300, "a sensor to defer")
    waiting = deferred_run()
    # Both crash and are started again while the sensor is deferred: the trigger must
    # move to the new triggerer, and the new scheduler must run what it hands back.
    restarted = [restart_component(standalone, component) for component in ("scheduler", "triggerer")]
    # The end of input: the watermark becomes +inf and passes every hour; only the
    # trigger, in the triggerer, can hand the deferred sensor back to a worker.
    assert flush(spark, registry)
    for run_id in dict.fromkeys([waiting, mine]):
        assert airflow.wait_for_run(dag_id, run_id, timeout=600) == "success", run_id
        assert task_state(airflow, dag_id, run_id, "report") == "success"
    assert all(process.poll() is None for process in restarted)
    # The deferred sensor's trigger fired in the triggerer started after the crash.
    triggerers = airflow.request("GET", "/api/v2/jobs?job_type=TriggererJob&limit=100")["jobs"]
    newest = max(job["id"] for job in triggerers)
    logs = trigger_logs(standalone.home, dag_id, waiting, sensor)
    assert [job for job, text in logs.items() if "Trigger fired event" in text] == [newest], logs.keys()
