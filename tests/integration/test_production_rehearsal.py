"""A production rehearsal on loopback: Airflow on PostgreSQL with the LocalExecutor
submits every job to a Spark standalone master with two workers; the lakehouse is on
an S3 server (SeaweedFS) and nowhere else; ``tidemark generate`` feeds a Kafka topic
at a fixed rate for a fixed time.

The pipeline's four continuous streams run as one application in one Airflow task,
with late merges, idleness checks and maintenance beside them. Early in the feed the
application is killed with SIGKILL; half-way, while a merge runs and an hourly report's
WatermarkSensor is deferred, the scheduler and the triggerer are; new ones start,
and Airflow's retries restart what ran. Afterwards the tables reconcile
exactly, silver, gold and the status events equal a batch computation over bronze,
and the SQL server answers over the same S3 lakehouse.

Rates and memory are printed as a report (figures, not pass/fail)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F
from tidemark_airflow.standalone import processes_of, wait

from spark_jobs.generator import START_MS, FleetSpec, Manifest, generate, malformed_kinds
from spark_jobs.session import DEFAULT_PROFILE, JVM_PROFILES
from tests.integration.airflow_standalone import (
    airflow_standalone,
    command_line,
    newest_triggerer,
    restart_component,
    stream_drivers,
    trigger_logs,
)
from tests.integration.conftest import assert_bronze_reconciles, registry_for, write_pipeline
from tests.integration.lakehouse_sql import (
    batch_gold,
    batch_silver,
    batch_status_events,
    engine_gold,
    engine_silver,
    engine_status_events,
)
from tests.integration.postgres import PostgresServer
from tests.integration.spark_cluster import Cluster, standalone_cluster
from tests.integration.sql_server import sql_server
from tests.integration.test_late_merge import assert_reconciles, quarantine_by_status, statuses_of
from tests.integration.test_object_storage import objects_under

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(2400)]

FEED_SECONDS = 60  # the generator is paced to spread the fleet's records over this
FLEET = FleetSpec(
    devices=15, partitions=3, seed=77, duration_ms=100 * 60_000, late_ratio=0.03, malformed_ratio=0.01
)
JOBS = ("run", "merge_late", "check_idle", "maintenance")
# Partitions go idle after seconds rather than the shipped minute, so the wait for
# the idleness check after the feed stops is short.
IDLENESS_S = 10
IDLENESS, MAINTENANCE, MERGE, REPORT = (
    "tidemark_idleness_check",
    "tidemark_maintenance",
    "tidemark_late_merge",
    "tidemark_hourly_report",
)
DAGS = ("tidemark_streaming", MERGE, IDLENESS, MAINTENANCE, REPORT)
# The report's run covers the hour before a moment 98 minutes into the fleet's 100: the
# watermark passes it at the feed's end or at the idleness step, after the restarts half-way.
REPORT_HOUR_END = datetime.fromtimestamp(START_MS / 1000, UTC) + timedelta(minutes=98)
REPORT_SENSOR = "hour_complete_in_event_time"
# Unpaused only when their first run is due: unpausing runs a schedule's latest interval.
UNPAUSED_LATER = (IDLENESS, MAINTENANCE)
# Two workers of two cores, an application gets one unless it asks: the streams, a merge,
# an idleness check and maintenance run at once, each with its executor on a worker.
WORKERS, WORKER_CORES, APP_CORES = 2, 2, 1


class MemorySampler(threading.Thread):
    """Peak resident memory, every few seconds, of every process carrying the
    standalone's AIRFLOW_HOME (Airflow itself and the Spark jobs its tasks run)."""

    def __init__(self, home: Path, every: float = 3.0) -> None:
        super().__init__(daemon=True)
        self.home, self.every = home, every
        self.peak_total_mb = 0.0
        self.peak_airflow_mb = 0.0
        self.peak_job_mb: dict[str, float] = defaultdict(float)
        self.job_profiles: dict[str, set[str]] = defaultdict(set)
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.every):
            airflow_mb, jobs_mb = 0.0, defaultdict(float)
            for pid in processes_of(self.home):
                resident = resident_mb(pid)
                job = next((j for j in JOBS if job_runs(pid, j)), None)
                if job is None:
                    airflow_mb += resident
                else:
                    jobs_mb[job] += resident
                    profile = jvm_profile_of(pid)
                    if profile is not None:
                        self.job_profiles[job].add(profile)
            self.peak_airflow_mb = max(self.peak_airflow_mb, airflow_mb)
            self.peak_total_mb = max(self.peak_total_mb, airflow_mb + sum(jobs_mb.values()))
            for job, megabytes in jobs_mb.items():
                self.peak_job_mb[job] = max(self.peak_job_mb[job], megabytes)


def resident_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def job_runs(pid: int, job: str) -> bool:
    """The JVM or Python driver of a spark-submit of ``job``."""
    return any(argument.endswith(f"jobs/{job}.py") for argument in command_line(pid))


def jvm_profile_of(pid: int) -> str | None:
    """The JVM profile a job's driver JVM runs under, from its command line (None: not
    the driver's JVM, say its Python or spark-submit's launcher)."""
    arguments = command_line(pid)
    if not arguments or not arguments[0].endswith("java") or "org.apache.spark.launcher.Main" in arguments:
        return None
    flagged = [name for name, profile in JVM_PROFILES.items() if profile.java_options]
    given = set(arguments)
    return next(
        (name for name in flagged if set(JVM_PROFILES[name].java_options.split()) <= given), DEFAULT_PROFILE
    )


def count(spark, path: str, where: str = "true") -> int:
    """The rows of the table at ``path`` matching ``where``; none before it is created
    (on a loaded machine the restarted application may not have created it by the
    feed's end)."""
    if not DeltaTable.isDeltaTable(spark, path):
        return 0
    return spark.read.format("delta").load(path).where(where).count()


def judged(spark, registry) -> int:
    """Bronze records silver has judged (on time or late), from its watermark history."""
    history = spark.read.format("delta").load(registry.ops["watermark_history"].path)
    return history.selectExpr("coalesce(sum(on_time_count + late_count), 0)").first()[0]


def latest_step(spark, registry):
    """The newest watermark history row: the combined watermark now."""
    history = spark.read.format("delta").load(registry.ops["watermark_history"].path)
    return history.orderBy(F.desc("processing_time"), F.desc("batch_id")).first()


def detector_read_all(spark, registry) -> bool:
    """Whether offline detection's clock has reached the newest bronze version silver judged."""
    history = spark.read.format("delta").load(registry.ops["watermark_history"].path)
    judged_up_to = history.selectExpr("max(batch_id)").first()[0]
    clock = spark.read.format("delta").load(registry.offline_state.path).where("kind = 'clock'").first()
    return clock is not None and clock.version >= judged_up_to


def fired(watermark: int) -> str:
    """A bronze filter: records in the one-minute windows ``watermark`` has passed."""
    return f"unix_millis(date_trunc('minute', event_time)) + 60000 - 1 <= {watermark}"


def runs_of(airflow, dag_id: str, run_type: str | None = None) -> list[str]:
    """The ids of ``dag_id``'s runs (of ``run_type``, if given), oldest first (the API's order)."""
    query = f"?run_type={run_type}" if run_type else ""
    return [
        run["dag_run_id"]
        for run in airflow.request("GET", f"/api/v2/dags/{dag_id}/dagRuns{query}")["dag_runs"]
    ]


def applications_of(cluster: Cluster, pipeline: Path) -> list[dict]:
    """The pipeline's applications on the master, finished or running."""
    state = cluster.master_state()
    return [
        app for app in state["completedapps"] + state["activeapps"] if app["name"].endswith(pipeline.stem)
    ]


def task_instances(airflow, dag_id: str, run_id: str) -> dict[str, dict]:
    """A run's task instances by task id (a mapped task's last)."""
    listed = airflow.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances")
    return {task["task_id"]: task for task in listed["task_instances"]}


def state_of(airflow, dag_id: str, run_id: str, task_id: str) -> str | None:
    return task_instances(airflow, dag_id, run_id).get(task_id, {}).get("state")


def wait_for_merging_run(airflow, timeout: float) -> str:
    """The merge run whose merge task is running (the DAG runs one at a time), once
    there is one."""
    deadline = time.monotonic() + timeout
    while True:
        running = airflow.request("GET", f"/api/v2/dags/{MERGE}/dagRuns?state=running")["dag_runs"]
        for run in (run["dag_run_id"] for run in running):
            if state_of(airflow, MERGE, run, "merge_late") == "running":
                return run
        if time.monotonic() > deadline:
            raise TimeoutError(f"no merge ran within {timeout:.0f} s")
        time.sleep(0.5)


def scheduled_passes(airflow) -> list[str]:
    """The state of the pipeline's pass in every scheduled run of the streaming DAG."""
    runs = airflow.request("GET", "/api/v2/dags/tidemark_streaming/dagRuns?run_type=scheduled")["dag_runs"]
    return [
        task["state"]
        for run in runs
        for task in airflow.request(
            "GET", f"/api/v2/dags/tidemark_streaming/dagRuns/{run['dag_run_id']}/taskInstances"
        )["task_instances"]
        if task["task_id"] == "available_now.pipeline"
    ]


def test_a_production_rehearsal_on_a_cluster_over_s3_loses_and_doubles_nothing(
    spark, tmp_path, kafka_broker, s3_server, monkeypatch
):
    # The S3 server's endpoint and keys reach every process as a deployment's environment would.
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    topic = "rehearsal"
    kafka_broker.create_topic(topic, FLEET.partitions)
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    pipeline = write_pipeline(
        pipelines,
        pipeline="rehearsal",
        source={
            "kind": "kafka",
            "bootstrap_servers": kafka_broker.bootstrap_servers,
            "topic": topic,
            "starting_offsets": "earliest",
            "max_offsets_per_trigger": 5000,
        },
        watermark={"strategy": "bounded", "max_out_of_orderness": "5s", "idleness": f"{IDLENESS_S}s"},
    )
    lakehouse = f"s3a://{s3_server.bucket}/rehearsal-{uuid.uuid4().hex}/lake"
    registry = registry_for(pipeline, lakehouse)
    fleet = generate(FLEET, malformed_kinds("kafka"))
    manifest = Manifest.of(fleet)
    began, moments = time.monotonic(), {}

    def reached(moment: str) -> None:
        moments[moment] = round(time.monotonic() - began, 1)

    with ExitStack() as running:
        postgres = running.enter_context(PostgresServer(tmp_path / "postgres"))
        cluster = running.enter_context(
            standalone_cluster(
                tmp_path / "cluster",
                workers=WORKERS,
                cores=WORKER_CORES,
                memory="2g",
                default_cores=APP_CORES,
                worker_environment=s3_server.environment(),
            )
        )
        master_port = int(cluster.master_url.rsplit(":", 1)[1])
        settings = {
            **postgres.airflow_settings(),
            # The only pipeline, so the scheduled runs (idleness check, merge) take it too.
            "TIDEMARK_PIPELINES": str(pipeline),
            # The new scheduler looks for the dead one's tasks soon, not after 5 minutes.
            "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "20",
            # Every job on the cluster, its driver on loopback, shuffles sized for its core.
            "AIRFLOW_CONN_TIDEMARK_SPARK": json.dumps(
                {"conn_type": "spark", "host": "spark://127.0.0.1", "port": master_port}
            ),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "TIDEMARK_SHUFFLE_PARTITIONS": str(2 * APP_CORES),
            "TIDEMARK_CACHE_DIR": str(tmp_path / "cache"),
            # The report's sensor reads the watermark every few seconds, and a dead
            # triggerer's trigger moves to the new one after seconds, not the default 30.
            "AIRFLOW__TIDEMARK__WATERMARK_POKE_INTERVAL": "3",
            "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "10",
        }
        standalone = running.enter_context(airflow_standalone(tmp_path / "airflow", lakehouse, settings))
        reached("standalone_up")
        airflow = standalone.client
        sampler = MemorySampler(standalone.home)
        sampler.start()
        airflow.wait_for_dags(list(DAGS))
        # Every job under the workers' profile (the suite's short-jobs): the run's own
        # choice ahead of it is the DAG's and the operator's to render (test_dags,
        # test_operators); under throughput the application took 192 CPU-s here, not 110.
        streaming = airflow.trigger("tidemark_streaming", {"mode": "continuous", "interval": "5s"})
        report = airflow.trigger(REPORT, {"pipeline": pipeline.stem}, logical_date=REPORT_HOUR_END)
        for dag_id in DAGS:
            if dag_id not in UNPAUSED_LATER:
                airflow.unpause(dag_id)
        # Unpausing scheduled the report of the hour before now, which the fleet's event
        # time never reaches: it would hold the DAG's one active run, so it is failed.
        wait(lambda: runs_of(airflow, REPORT, "scheduled"), 120, "the report's scheduled run")
        for run_id in runs_of(airflow, REPORT, "scheduled"):
            airflow.request("PATCH", f"/api/v2/dags/{REPORT}/dagRuns/{run_id}", {"state": "failed"})
        try:
            wait(lambda: stream_drivers("run", str(pipeline)), 600, "the pipeline's application")
            reached("application_started")

            feed_started = time.monotonic()
            generator = subprocess.Popen(
                [
                    str(Path(sys.executable).with_name("tidemark")),
                    "generate",
                    *("--pipeline", str(pipeline), "--seed", str(FLEET.seed)),
                    *("--devices", str(FLEET.devices), "--partitions", str(FLEET.partitions)),
                    *("--duration", f"{FLEET.duration_ms // 60_000}m"),
                    *("--late-ratio", str(FLEET.late_ratio), "--malformed-ratio", str(FLEET.malformed_ratio)),
                    *("--rate", str(manifest.records / FEED_SECONDS)),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            # The application crashes early; a merge starts, and half-way the scheduler and
            # the triggerer crash while it runs and the report's sensor is deferred: the new
            # scheduler resets the orphaned tasks and their retries run them again, the new
            # triggerer takes the sensor's trigger over.
            for moment in (0.2, 0.35, 0.5, 0.7):
                time.sleep(max(0.0, feed_started + moment * FEED_SECONDS - time.monotonic()))
                if moment == 0.2:
                    killed_drivers = stream_drivers("run", str(pipeline))
                    for pid in killed_drivers:
                        os.kill(pid, signal.SIGKILL)
                elif moment == 0.35:
                    # A merge to run at the restart, unless a scheduled one merges then.
                    triggered_merge = airflow.trigger(MERGE, {"pipeline": pipeline.stem})
                elif moment == 0.5:
                    merge_beside = wait_for_merging_run(airflow, 180)
                    assert state_of(airflow, REPORT, report, REPORT_SENSOR) == "deferred"
                    restarted = [restart_component(standalone, name) for name in ("scheduler", "triggerer")]
                    killed_at = time.monotonic() - feed_started
                else:
                    # Unpaused, the daily maintenance schedules its latest interval now.
                    airflow.unpause(MAINTENANCE)
            output, _ = generator.communicate(timeout=FEED_SECONDS * 4)
            feed_seconds = time.monotonic() - feed_started
            reached("feed_done")
            assert generator.returncode == 0
            assert json.loads(output)["records"] == manifest.records
            bronze_at_feed_end = count(spark, registry.bronze.path)

            airflow.wait_until_healthy()  # the new scheduler and triggerer heartbeat
            assert all(process.poll() is None for process in restarted)

            def everything_ingested() -> bool:
                ingested = count(spark, registry.bronze.path) + count(spark, registry.ops["rejects"].path)
                return ingested >= manifest.records

            wait(everything_ingested, 900, "bronze to ingest every record", every=5)
            bronze_caught_up = time.monotonic()
            caught_up_after = bronze_caught_up - feed_started - feed_seconds
            reached("bronze_caught_up")
            wait(
                lambda: judged(spark, registry) == count(spark, registry.bronze.path), 600, "silver", every=5
            )
            reached("silver_caught_up")
            # The detector judges tracks late a batch or more behind silver: only once it
            # has read every bronze version silver judged are its late tracks complete.
            wait(lambda: detector_read_all(spark, registry), 600, "offline detection", every=5)
            reached("detector_caught_up")
            # Every record and track is judged, so both side outputs are complete: the
            # last merge folds them in while the idleness checks below run beside it.
            merge = airflow.trigger(MERGE, {})

            # The feed has stopped: once every partition has been quiet for the
            # idleness timeout (by silver's clock), an idleness check marks them
            # all idle and the watermark moves to the highest partition's (Flink's
            # rule), firing what it passed.
            # A partition's last activity is its last record's bronze batch, so it is
            # quiet for the timeout a little after this, whenever silver caught up. The
            # first check is the schedule's (unpaused now), any further one triggered.
            time.sleep(max(0.0, bronze_caught_up + IDLENESS_S + 2 - time.monotonic()))
            airflow.unpause(IDLENESS)
            wait(lambda: runs_of(airflow, IDLENESS), 120, "the scheduled idleness check")
            checks = runs_of(airflow, IDLENESS)
            for _ in range(6):
                assert airflow.wait_for_run(IDLENESS, checks[-1]) == "success"
                if latest_step(spark, registry).active_partitions == 0:
                    break
                time.sleep(IDLENESS_S + 2)  # a retry waits the timeout after this check, as before
                checks.append(airflow.trigger(IDLENESS, {"stall_after": "1h"}))
            final = latest_step(spark, registry)
            reached("all_idle")
            assert final.active_partitions == 0 and final.idle_partitions == FLEET.partitions
            assert airflow.wait_for_run(MERGE, merge) == "success"
            assert airflow.wait_for_run(MERGE, merge_beside) == "success"
            assert airflow.wait_for_run(MERGE, triggered_merge) == "success"
            # The report's hour passed while the new triggerer polled: its trigger fired
            # there and handed the sensor back to the new scheduler, which ran the report.
            assert airflow.wait_for_run(REPORT, report) == "success"
            reported = task_instances(airflow, REPORT, report)
            assert {task: instance["state"] for task, instance in reported.items()} == {
                REPORT_SENSOR: "success",
                "report": "success",
            }
            sensor_logs = trigger_logs(standalone.home, REPORT, report, REPORT_SENSOR)
            fired_in = [job for job, text in sensor_logs.items() if "Trigger fired event" in text]
            assert fired_in == [newest_triggerer(airflow)], sensor_logs.keys()
            (maintained,) = runs_of(airflow, MAINTENANCE, "scheduled")
            assert airflow.wait_for_run(MAINTENANCE, maintained) == "success"
            # Airflow's retry restarted the killed application.
            drivers = stream_drivers("run", str(pipeline))
            assert killed_drivers and drivers and not set(drivers) & set(killed_drivers)

            # Bronze is complete and the watermark final: what gold and the status
            # events must become is fixed, so it is computed once, not on every poll.
            reached("merges_done")
            expected_gold = batch_gold(spark, registry, fired(final.watermark))
            expected_events = batch_status_events(spark, registry, final.watermark)

            # What is still apart on each poll, so that a timeout says which of the three it was.
            apart: list[str] = []

            def converged() -> bool:
                apart[:] = [
                    name
                    for name, equal in (
                        ("quarantine", lambda: set(quarantine_by_status(spark, registry)) == {"merged"}),
                        ("late tracks", lambda: statuses_of(spark, registry.late_tracks.path) == {"merged"}),
                        ("gold", lambda: engine_gold(spark, registry) == expected_gold),
                        ("status events", lambda: engine_status_events(spark, registry) == expected_events),
                    )
                    if not equal()
                ]
                return not apart

            try:
                wait(converged, 600, "gold and offline to take in the fire and the merges", every=5)
            except TimeoutError as timeout:
                statuses = quarantine_by_status(spark, registry)
                raise AssertionError(f"still apart: {apart}; quarantine by status: {statuses}") from timeout
            reached("converged")
            streamed = task_instances(airflow, "tidemark_streaming", streaming)
            tries = {task: instance["try_number"] for task, instance in streamed.items()}
            merge_tries = task_instances(airflow, MERGE, merge_beside)["merge_late"]["try_number"]
            # Unpausing created a scheduled run beside the triggered one. Whichever the
            # scheduler started first, the scheduled one never ran its pass: it gave way
            # (skipped) or is still queued behind the triggered one (no state yet).
            passes = scheduled_passes(airflow)
            applications, executors = applications_of(cluster, pipeline), cluster.executors_by_app()
        finally:
            sampler.stopped.set()
            airflow.request(
                "PATCH", f"/api/v2/dags/tidemark_streaming/dagRuns/{streaming}", {"state": "failed"}
            )

    reached("stopped")
    assert standalone.leftovers == [], "Airflow left processes behind"
    # Every job ran under the workers' profile, on the driver as on its JVM.
    assert dict(sampler.job_profiles) == {job: {"short-jobs"} for job in JOBS}
    # The killed application's task failed and its retry ran the restarted one.
    assert tries["continuous.pipeline"] >= 2, tries
    # Every job ran on the cluster: an application of the master (the killed streams and
    # their restart at least two), each with its one core's executor, on both workers.
    names = Counter(app["name"] for app in applications)
    assert set(names) == {f"tidemark-{job.replace('_', '-')}-rehearsal" for job in JOBS}, names
    assert names["tidemark-run-rehearsal"] >= 2 and names["tidemark-merge-late-rehearsal"] >= 1
    assert {app["cores"] for app in applications} == {APP_CORES}
    assert all(executors.get(app["id"]) for app in applications), "an application ran no executor"
    # A worker keeps a folder per application it ran an executor of.
    hosted = [{folder.name for folder in work_dir.iterdir()} for work_dir in cluster.work_dirs]
    assert all(hosted) and {app["id"] for app in applications} <= set().union(*hosted), hosted
    # Executors fetch the package the operator built with their first task (an application
    # killed before its first has none): every copy on the workers is that package.
    (built,) = (tmp_path / "cache").glob("spark_jobs-*.zip")
    shipped = [path for work_dir in cluster.work_dirs for path in work_dir.glob("*/*/spark_jobs-*.zip")]
    assert shipped and all(path.read_bytes() == built.read_bytes() for path in shipped)
    # The lakehouse is on the object store and nowhere else: no table, checkpoint or data
    # file on this machine's disk, not in Airflow's folder nor in the workers' folders.
    local = [path for pattern in ("_delta_log", "*.parquet", "offsets") for path in tmp_path.rglob(pattern)]
    assert local == [] and not Path("s3a:").exists(), local
    root = lakehouse.removeprefix("s3a://")
    assert objects_under(s3_server, f"{root}/_checkpoints/{registry.config.name}")
    assert passes and set(passes) <= {"skipped", None}, passes
    assert_bronze_reconciles(spark, registry, manifest, fleet)
    statuses = quarantine_by_status(spark, registry)
    assert set(statuses) == {"merged"} and statuses["merged"] > 0
    assert_reconciles(spark, registry)
    assert engine_silver(spark, registry) == batch_silver(spark, registry)
    assert engine_gold(spark, registry) == expected_gold
    assert engine_status_events(spark, registry) == expected_events
    # All idle: the watermark is the highest partition's, the newest event time less the bound and 1 ms.
    newest = spark.read.format("delta").load(registry.bronze.path).selectExpr("max(unix_millis(event_time))")
    assert final.watermark == newest.first()[0] - registry.config.watermark.bound_ms - 1
    # Exactly the windows the watermark passed have fired; the rest are open.
    windows = spark.read.format("delta").load(registry.silver.path)
    passed = f"unix_millis(window_end) - 1 <= {final.watermark}"
    assert windows.where(f"{passed} AND status = 'open'").count() == 0
    assert windows.where(f"NOT ({passed}) AND status != 'open'").count() == 0
    history = spark.read.format("delta").load(registry.ops["watermark_history"].path).collect()
    assert judged(spark, registry) == count(spark, registry.bronze.path)
    batches = [row.batch_id for row in history if row.on_time_count + row.late_count > 0]
    assert len(batches) == len(set(batches)), "a silver batch was recorded twice"

    # The SQL server over the same lakehouse, finding every table on the store.
    layers = (registry.bronze, registry.silver, registry.quarantine, registry.gold)
    with sql_server(lakehouse, tmp_path / "no-pipelines", "--state-dir", str(tmp_path / "sql")) as server:
        served = server.counts(layers)
    assert served == {table.sql_name: count(spark, table.path) for table in layers}
    reached("sql_answered")

    report = json.dumps(
        {
            "records": manifest.records,
            "feed_s": round(feed_seconds, 1),
            "produced_per_s": round(manifest.records / feed_seconds, 1),
            "bronze_at_feed_end": bronze_at_feed_end,
            "caught_up_s_after_feed": round(caught_up_after, 1),
            "scheduler_killed_at_s": round(killed_at, 1),
            "stream_tries": tries,
            "merge_beside_restart_tries": merge_tries,
            "late_quarantined_and_merged": statuses["merged"],
            "silver_batches": len(history),
            "idleness_checks": len(checks),
            "seconds_since_start": moments,
            "peak_rss_total_mb": round(sampler.peak_total_mb),
            "peak_rss_airflow_mb": round(sampler.peak_airflow_mb),
            "peak_rss_per_job_mb": {job: round(mb) for job, mb in sorted(sampler.peak_job_mb.items())},
        }
    )
    # Figures, not assertions: kept beside the run's tables for whoever reads them.
    (tmp_path / "rehearsal-report.json").write_text(report + "\n")
    print("\nrehearsal report:", report)
