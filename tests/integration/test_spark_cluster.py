"""docker-compose.yml's topology natively, on loopback: a Spark standalone master and
worker started from the pyspark distribution, Airflow's SparkSubmitOperator (the
project's TidemarkJobOperator, in the real tidemark_streaming DAG) submitting the
pipeline to ``spark://127.0.0.1:PORT`` through the connection ``tidemark_spark``,
the applications seen on the master with their executors on the worker, the
package zip on the executors, and the tables reconciled exactly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyspark
import pytest
from tidemark_airflow.operators import TidemarkJobOperator

from spark_jobs.config import load_pipeline
from spark_jobs.generator import FleetSpec, Manifest, generate, write_landing
from spark_jobs.servers import free_port
from spark_jobs.tables import TableRegistry
from tests.integration.conftest import assert_bronze_reconciles, write_pipeline
from tests.integration.engine import assert_reconciles
from tests.integration.lakehouse_sql import batch_silver, engine_silver, not_quarantined

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).parent
JOBS = ("bronze", "silver", "gold")
WORKER_CORES = 2


@dataclass
class Cluster:
    master_url: str
    master_ui: str
    worker_ui: str
    work_dir: Path
    logs: list[Path]

    def master_state(self) -> dict:
        return fetch_json(f"{self.master_ui}/json/")

    def worker_state(self) -> dict:
        return fetch_json(f"{self.worker_ui}/json/")

    def log_tails(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in self.logs if log.exists())


def fetch_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def spark_class(folder: Path, name: str, *args: str) -> tuple[subprocess.Popen, Path]:
    """A Spark daemon in the foreground, in its own process group, logging to a file."""
    log = folder / f"{name}.log"
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_NO_DAEMONIZE": "1",
        "SPARK_LOG_DIR": str(folder / "logs"),
        "SPARK_WORKER_DIR": str(folder / "work"),
    }
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    return process, log


def stop(process: subprocess.Popen) -> None:
    for sig, patience in ((signal.SIGTERM, 30), (signal.SIGKILL, 30)):
        if process.poll() is not None:
            return
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=patience)
        except subprocess.TimeoutExpired:
            continue


def wait_until(condition, timeout: float, what: str, cluster_logs=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{cluster_logs()}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    """One master and one worker (two cores, 1 GB: the executor's default size) on
    free loopback ports; both process groups are always stopped."""
    folder = tmp_path_factory.mktemp("spark-cluster")
    port, master_ui, worker_port, worker_ui = (free_port() for _ in range(4))
    master, master_log = spark_class(
        folder,
        "master",
        "org.apache.spark.deploy.master.Master",
        *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(master_ui)),
    )
    processes, logs = [master], [master_log]
    state = Cluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{master_ui}", "", folder / "work", logs)
    try:
        wait_until(lambda: state.master_state()["status"] == "ALIVE", 120, "the master", state.log_tails)
        worker, worker_log = spark_class(
            folder,
            "worker",
            "org.apache.spark.deploy.worker.Worker",
            state.master_url,
            *("--host", "127.0.0.1", "--port", str(worker_port), "--webui-port", str(worker_ui)),
            *("--cores", str(WORKER_CORES), "--memory", "1g", "--work-dir", str(state.work_dir)),
        )
        processes.append(worker)
        logs.append(worker_log)
        state.worker_ui = f"http://127.0.0.1:{worker_ui}"
        wait_until(lambda: state.master_state()["aliveworkers"] == 1, 120, "the worker", state.log_tails)
        yield state
    finally:
        for process in reversed(processes):
            stop(process)


@pytest.fixture(scope="module")
def airflow_db():
    """dag.test() records its runs in Airflow's metadata database (SQLite here)."""
    subprocess.run(
        [str(Path(sys.executable).with_name("airflow")), "db", "migrate"], check=True, capture_output=True
    )


@pytest.fixture
def on_the_cluster(cluster, tmp_path, monkeypatch) -> Path:
    """The connection points at the cluster; drivers bind to loopback; shuffles are
    sized for the worker's cores, as docker-compose.yml sizes them for its workers;
    the package zip is built into this test's cache folder (returned)."""
    port = int(cluster.master_url.rsplit(":", 1)[1])
    connection = {"conn_type": "spark", "host": "spark://127.0.0.1", "port": port}
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_SPARK", json.dumps(connection))
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    monkeypatch.setenv("TIDEMARK_SHUFFLE_PARTITIONS", str(2 * WORKER_CORES))
    monkeypatch.setenv("TIDEMARK_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def applications(cluster: Cluster) -> dict[str, dict]:
    """Finished applications on the master by name (``tidemark-<job>-<pipeline>``)."""
    return {app["name"]: app for app in cluster.master_state()["completedapps"]}


def executors_by_app(cluster: Cluster) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    worker = cluster.worker_state()
    for executor in worker["executors"] + worker["finishedexecutors"]:
        found.setdefault(executor["appid"], []).append(executor)
    return found


def test_the_streaming_dag_runs_the_pipeline_on_the_cluster_and_reconciles_exactly(
    cluster, on_the_cluster, airflow_db, spark, tmp_path, monkeypatch
):
    from airflow.dag_processing.dagbag import DagBag

    lakehouse = tmp_path / "lakehouse"
    # One file per bronze micro-batch: silver judges each against the watermark the
    # earlier ones moved, so late uploads are quarantined within the one run.
    pipeline = write_pipeline(
        tmp_path,
        source={"kind": "files", "path": "landing/telemetry", "format": "json", "max_files_per_trigger": 1},
    )
    monkeypatch.setenv("LAKEHOUSE_DIR", str(lakehouse))
    monkeypatch.setenv("TIDEMARK_PIPELINES", str(pipeline))
    registry = TableRegistry(load_pipeline(pipeline), str(lakehouse))
    fleet = generate(
        FleetSpec(
            devices=6, partitions=3, seed=9, duration_ms=20 * 60_000, late_ratio=0.05, malformed_ratio=0.02
        )
    )
    files = write_landing(fleet, registry.landing_path, 300)
    assert len(files) == 2

    streaming = DagBag(dag_folder=str(REPO / "dags")).dags["tidemark_streaming"]
    drains = streaming.partial_subset([f"available_now.{job}" for job in JOBS], include_upstream=False)
    started = time.monotonic()
    run = drains.test(run_conf={"mode": "available-now"})
    elapsed = time.monotonic() - started
    assert run.state == "success", cluster.log_tails()
    assert {ti.task_id: ti.state for ti in run.get_task_instances()} == {
        f"available_now.{job}": "success" for job in JOBS
    }

    # The jobs ran on the cluster: each one an application of the master, with its
    # executor on the worker, holding the package zip the operator built and shipped.
    apps = {name: app for name, app in applications(cluster).items() if name.endswith("-telemetry")}
    assert set(apps) == {f"tidemark-{job}-telemetry" for job in JOBS}
    print(
        f"DAG run {elapsed:.0f} s;", ", ".join(f"{n} {a['duration'] / 1000:.0f} s" for n, a in apps.items())
    )
    executors = executors_by_app(cluster)
    built = {path.name: path.read_bytes() for path in on_the_cluster.glob("spark_jobs-*.zip")}
    assert built, "the operator shipped no package"
    for job in JOBS:
        app = apps[f"tidemark-{job}-telemetry"]
        assert app["state"] == "FINISHED" and app["cores"] == WORKER_CORES
        assert executors.get(app["id"]), f"{job} had no executor on the worker"
        shipped = list((cluster.work_dir / app["id"]).glob("*/spark_jobs-*.zip"))
        assert shipped and all(zip_file.read_bytes() == built.get(zip_file.name) for zip_file in shipped)

    # Nothing lost, nothing doubled: input = bronze + rejects, record for record; every
    # (bronze record, window) pair once in silver or in the quarantine; silver's values
    # equal a batch computation over the on-time records.
    assert_bronze_reconciles(spark, registry, Manifest.of(fleet), fleet)
    assert_reconciles(spark, registry, [record.payload for record in fleet if record.reason is None])
    assert spark.read.format("delta").load(registry.quarantine.path).count() > 0
    assert engine_silver(spark, registry) == batch_silver(spark, registry, not_quarantined(registry))
    # Gold rolls up exactly the fired and closed windows.
    gold = spark.sql(
        f"SELECT unix_millis(grain_start) AS h, region, record_count FROM delta.`{registry.gold.path}`"
    ).collect()
    fired = spark.sql(
        f"""SELECT unix_millis(date_trunc('hour', window_start)) AS h, region, sum(record_count) AS n
            FROM delta.`{registry.silver.path}` WHERE status IN ('fired', 'closed') GROUP BY 1, 2"""
    ).collect()
    assert {(r.h, r.region): r.record_count for r in gold if r.record_count} == {
        (r.h, r.region): r.n for r in fired
    }
    assert fired


PROBE = textwrap.dedent(
    """
    import json, os, sys
    from pyspark.sql import SparkSession

    def where(_):
        import spark_jobs
        return [(os.getcwd(), spark_jobs.__file__)]

    spark = SparkSession.builder.getOrCreate()
    found = spark.sparkContext.parallelize(range(2), 2).mapPartitions(where).collect()
    with open(sys.argv[1], "w") as out:
        json.dump(found, out)
    spark.stop()
    """
)


def test_executors_python_workers_import_the_package_the_operator_shipped(
    cluster, on_the_cluster, airflow_db, tmp_path
):
    """Python code on the executors (a UDF, a mapPartitions) imports spark_jobs from
    the operator's zip in the executor's folder, not from the driver's checkout."""
    from airflow.dag_processing.dagbag import DagBag

    script, found = tmp_path / "probe.py", tmp_path / "found.json"
    script.write_text(PROBE)
    # dag.test() runs DAGs its bundle knows: the probe is the streaming DAG's bronze
    # operator (a copy, in a one-task subset) pointed at the probe script.
    streaming = DagBag(dag_folder=str(REPO / "dags")).dags["tidemark_streaming"]
    subset = streaming.partial_subset(["available_now.bronze"], include_upstream=False)
    probe = subset.get_task("available_now.bronze")
    assert isinstance(probe, TidemarkJobOperator)
    probe.application, probe.application_args = str(script), [str(found)]
    run = subset.test(run_conf={"mode": "available-now"})
    assert run.state == "success", cluster.log_tails()

    zips = [path.name for path in on_the_cluster.glob("spark_jobs-*.zip")]
    assert len(zips) == 1
    imported = json.loads(found.read_text())
    assert len(imported) == 2
    for folder, module in imported:
        location = Path(folder, module).resolve()
        assert location.is_relative_to(cluster.work_dir.resolve())
        assert location.parts[-3:] == (zips[0], "spark_jobs", "__init__.py")
