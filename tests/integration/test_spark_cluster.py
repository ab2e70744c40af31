"""Python on a cluster's executors: a Spark standalone master and worker started from
the pyspark distribution on loopback, Airflow's SparkSubmitOperator (the project's
TidemarkJobOperator, from the real tidemark_streaming DAG) submitting to
``spark://127.0.0.1:PORT`` through the connection ``tidemark_spark``, and the
executors' Python workers importing the package the operator shipped. The whole
pipeline on a cluster under Airflow is test_production_rehearsal.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from tidemark_airflow.operators import TidemarkJobOperator

from tests.integration.spark_cluster import Cluster, standalone_cluster

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
JOBS = ("bronze", "silver", "gold")
WORKER_CORES = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    """One master and one worker (two cores, 1 GB: the executor's default size)."""
    with standalone_cluster(tmp_path_factory.mktemp("spark-cluster"), cores=WORKER_CORES) as running:
        yield running


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
        assert location.is_relative_to(cluster.work_dirs[0].resolve())
        assert location.parts[-3:] == (zips[0], "spark_jobs", "__init__.py")
