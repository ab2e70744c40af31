"""End to end under a real `airflow standalone`: DAG runs triggered through the
REST API run the real jobs through spark-submit; the tables reconcile exactly;
the WatermarkSensor waits in the triggerer until the watermark passes its hour. A
killed stream restarted by Airflow is in test_production_rehearsal.py."""

from __future__ import annotations

import urllib.error
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from tidemark_airflow.standalone import Airflow, wait

from spark_jobs.config import load_pipeline
from spark_jobs.engine.watermark_steps import flush
from spark_jobs.generator import START_MS, FleetSpec, generate, write_landing
from spark_jobs.tables import TableRegistry
from tests.integration.airflow_standalone import airflow_standalone

# Each DAG run is several spark-submits (about 30 s each on 2 idle cores): give a
# loaded machine room beyond the suite's default 900 s per test.
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(2400)]

REPO = Path(__file__).resolve().parents[2]
PIPELINE = REPO / "spark_jobs" / "pipelines" / "telemetry.yaml"


@pytest.fixture(scope="module")
def lakehouse(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("e2e-lakehouse")


@pytest.fixture(scope="module")
def airflow(tmp_path_factory, lakehouse):
    # The sensor's trigger reads the watermark every few seconds, not every minute: the
    # test waits for the poll after the flush.
    settings = {"AIRFLOW__TIDEMARK__WATERMARK_POKE_INTERVAL": "3"}
    with airflow_standalone(tmp_path_factory.mktemp("e2e-airflow"), lakehouse, settings) as standalone:
        yield standalone.client
    assert standalone.leftovers == [], "Airflow left processes behind"


def count(spark, path: str, where: str = "true") -> int:
    return spark.read.format("delta").load(path).where(where).count()


def run_dag(airflow: Airflow, dag_id: str, conf: dict) -> tuple[str, dict[str, str]]:
    """Trigger ``dag_id`` and wait: the run's state and its tasks' states."""
    airflow.wait_for_dags([dag_id])
    airflow.unpause(dag_id)
    run_id = airflow.trigger(dag_id, conf)
    state = airflow.wait_for_run(dag_id, run_id)
    tasks = airflow.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
    return state, {task["task_id"]: task["state"] for task in tasks}


def test_streaming_and_late_merge_runs_through_the_rest_api_reconcile_exactly(airflow, lakehouse, spark):
    registry = TableRegistry(load_pipeline(PIPELINE), str(lakehouse))
    fleet = generate(
        FleetSpec(
            devices=6, partitions=3, seed=21, duration_ms=40 * 60_000, late_ratio=0.04, malformed_ratio=0.02
        )
    )
    # Two runs, each draining what had landed: late uploads in the second half
    # find their windows closed by the first run's watermark.
    half = len(fleet) // 2
    for part in (fleet[:half], fleet[half:]):
        write_landing(part, registry.landing_path, 250)
        state, tasks = run_dag(airflow, "tidemark_streaming", {"mode": "available-now"})
        assert state == "success"
        # One Spark application runs the pipeline's four streams; the per-job submits
        # (scale-out) and the continuous tasks are skipped.
        assert tasks["available_now.pipeline"] == "success"
        assert {tasks[f"available_now.{job}"] for job in ("bronze", "silver", "gold", "offline")} == {
            "skipped"
        }
        assert tasks["continuous.pipeline"] == "skipped"
    bronze, rejects = count(spark, registry.bronze.path), count(spark, registry.ops["rejects"].path)
    assert bronze + rejects == len(fleet) and rejects > 0
    pending = count(spark, registry.quarantine.path, "status = 'pending'")
    assert pending > 0

    assert run_dag(airflow, "tidemark_late_merge", {"pipeline": "telemetry"})[0] == "success"
    assert count(spark, registry.quarantine.path, "status = 'merged'") == pending
    silver = spark.read.format("delta").load(registry.silver.path)
    totals = silver.selectExpr("sum(record_count) AS all", "sum(late_merged_count) AS late").first()
    # Tumbling windows: every bronze record is in exactly one window, on time or merged late.
    assert totals.all == bronze and totals.late == pending


def task_state(airflow: Airflow, dag_id: str, run_id: str, task_id: str) -> str | None:
    path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
    try:
        return airflow.request("GET", path)["state"]
    except urllib.error.HTTPError as error:
        if error.code == 404:  # a run not scheduled yet has no task instances
            return None
        raise


def test_the_watermark_sensor_waits_in_the_triggerer_until_the_watermark_passes_its_hour(
    airflow, lakehouse, spark
):
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
    # The end of input: the watermark becomes +inf and passes every hour; only the
    # trigger, in the triggerer, can hand the deferred sensor back to a worker.
    assert flush(spark, registry)
    for run_id in dict.fromkeys([waiting, mine]):
        assert airflow.wait_for_run(dag_id, run_id, timeout=600) == "success", run_id
        assert task_state(airflow, dag_id, run_id, "report") == "success"
