"""Under a real `airflow standalone` on its embedded default (SQLite), over a lakehouse on
a small filesystem: the WatermarkSensor waits in the triggerer until the watermark
passes its hour, across a crash and restart of the scheduler and the triggerer; and
while the disk is full, every try of a streaming pass fails naming the full disk and
damages nothing, and the pass after space is freed resumes exactly. More DAG runs
that run the jobs through spark-submit, triggered through the REST API, are in
test_production_rehearsal.py (on PostgreSQL) and test_live_demo.py (from the page)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from tidemark_airflow.standalone import Airflow, wait

from spark_jobs.config import load_pipeline
from spark_jobs.engine import late_merge
from spark_jobs.engine.watermark_steps import flush
from spark_jobs.generator import START_MS, FleetSpec, Manifest, generate, land_files, malformed_kinds
from spark_jobs.lakehouse.checkpoints import damaged_log_files
from spark_jobs.lakehouse.commit_files import damaged_commits
from spark_jobs.tables import TableRegistry, join
from tests.integration.airflow_standalone import (
    airflow_standalone,
    newest_triggerer,
    restart_component,
    task_state,
    trigger_logs,
)
from tests.integration.conftest import assert_bronze_reconciles, registry_for, write_pipeline
from tests.integration.lakehouse_sql import batch_silver, engine_silver
from tests.integration.small_disk import fill, small_disk
from tests.integration.test_late_merge import assert_reconciles

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PIPELINE = REPO / "spark_jobs" / "pipelines" / "telemetry.yaml"


LAKEHOUSE_MB = 64
STREAMING, PASS = "tidemark_streaming", "available_now.pipeline"


@pytest.fixture(scope="module")
def lakehouse(tmp_path_factory) -> Iterator[Path]:
    with small_disk(tmp_path_factory.mktemp("e2e-lakehouse"), LAKEHOUSE_MB) as disk:
        yield disk


@pytest.fixture(scope="module")
def filling_pipeline(tmp_path_factory) -> Path:
    """A pipeline whose landing folder is off the small disk, so files land while it is full."""
    folder = tmp_path_factory.mktemp("e2e-pipelines")
    source = {"kind": "files", "path": str(folder / "landing"), "format": "json"}
    return write_pipeline(folder, pipeline="filling", source=source)


@pytest.fixture(scope="module")
def standalone(tmp_path_factory, lakehouse, filling_pipeline):
    settings = {
        "TIDEMARK_PIPELINES": f"{PIPELINE}:{filling_pipeline}",
        # The sensor's trigger reads the watermark every few seconds, not every minute:
        # the test waits for the poll after the flush.
        "AIRFLOW__TIDEMARK__WATERMARK_POKE_INTERVAL": "3",
        # A dead triggerer's triggers go to a live one once its heartbeat is this old.
        "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "10",
    }
    with airflow_standalone(tmp_path_factory.mktemp("e2e-airflow"), lakehouse, settings) as started:
        yield started
    assert started.leftovers == [], "Airflow left processes behind"


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
    logs = trigger_logs(standalone.home, dag_id, waiting, sensor)
    fired_in = [job for job, text in logs.items() if "Trigger fired event" in text]
    assert fired_in == [newest_triggerer(airflow)], logs.keys()


def attempt_logs(home: Path, dag_id: str, run_id: str, task_id: str) -> dict[int, str]:
    """A task's log of each try, by its number."""
    folder = home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
    tries = (re.fullmatch(r"attempt=(\d+)\.log", path.name) for path in folder.iterdir())
    return {int(match[1]): (folder / match[0]).read_text() for match in tries if match}


def all_runs_finished(airflow: Airflow, dag_id: str) -> bool:
    runs = airflow.request("GET", f"/api/v2/dags/{dag_id}/dagRuns")["dag_runs"]
    return all(run["state"] in ("success", "failed") for run in runs)


def test_while_the_disk_is_full_each_airflow_try_fails_by_name_and_a_pass_once_freed_resumes_exactly(
    standalone, lakehouse, filling_pipeline, spark
):
    airflow = standalone.client
    registry = registry_for(filling_pipeline, lakehouse)
    fleet = generate(
        FleetSpec(
            devices=4, partitions=2, seed=31, duration_ms=600_000, late_ratio=0.1, malformed_ratio=0.03
        ),
        malformed_kinds("files"),
    )
    manifest = Manifest.of(fleet)
    halves = [fleet[: len(fleet) // 2], fleet[len(fleet) // 2 :]]
    land_files([[record.line for record in halves[0]]], registry.landing_path, "json")
    airflow.wait_for_dags([STREAMING])
    first = airflow.trigger(STREAMING, {"pipeline": "filling"})
    # Unpausing also schedules a pass of the default pipeline (over its empty landing
    # folder), which gives way to this run or runs after it.
    airflow.unpause(STREAMING)
    assert airflow.wait_for_run(STREAMING, first) == "success"
    wait(lambda: all_runs_finished(airflow, STREAMING), 600, "the scheduled pass")

    filler = fill(lakehouse)
    land_files([[record.line for record in halves[1]]], registry.landing_path, "json")
    full = airflow.trigger(STREAMING, {"pipeline": "filling"})
    # Every try (the DAG's two retries too) fails while the disk stays full, naming it.
    assert airflow.wait_for_run(STREAMING, full) == "failed"
    logs = attempt_logs(standalone.home, STREAMING, full, PASS)
    assert sorted(logs) == [1, 2, 3]
    for attempt, text in logs.items():
        assert "a disk is full (No space left on device)" in text, (attempt, text[-3000:])
    checkpoints = join(registry.root, "_checkpoints", registry.config.name)
    for stream in ("bronze", "silver", "gold", "offline"):
        assert damaged_log_files(spark, join(checkpoints, stream)) == [], stream
    assert damaged_commits(spark, [table.path for table in registry.all()]) == []

    filler.unlink()
    freed = airflow.trigger(STREAMING, {"pipeline": "filling"})
    assert airflow.wait_for_run(STREAMING, freed) == "success"
    assert_bronze_reconciles(spark, registry, manifest, fleet)
    assert_reconciles(spark, registry)
    # With its late records merged in, silver is what a batch computation over bronze gives.
    late_merge.merge_late(spark, registry, late_merge.TimeRange())
    assert engine_silver(spark, registry) == batch_silver(spark, registry)
