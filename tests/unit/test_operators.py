"""How Tidemark's operators read the Spark connection: the master it stands for, as
the Spark provider reads it, and local or not."""

from __future__ import annotations

import json

import pytest
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from tidemark_airflow.operators import TidemarkJobOperator, spark_master

from spark_jobs.session import JVM_PROFILE_VARIABLE, is_local_master

CONNECTIONS = [
    # (the connection as stored, the master it stands for, local?)
    ({"conn_type": "spark", "host": "local[2]"}, "local[2]", True),
    ({"conn_type": "spark", "host": "local"}, "local", True),
    ({"conn_type": "spark", "host": "spark://10.0.0.7", "port": 7077}, "spark://10.0.0.7:7077", False),
    ({"conn_type": "spark", "host": "localhost", "port": 7077}, "spark://localhost:7077", False),
]


@pytest.mark.parametrize(("stored", "master", "local"), CONNECTIONS, ids=[c[1] for c in CONNECTIONS])
def test_a_connection_stands_for_the_master_the_provider_submits_to(stored, master, local, monkeypatch):
    assert spark_master(stored["conn_type"], stored["host"], stored.get("port")) == master
    assert is_local_master(master) is local
    # The provider's own reading of the same connection (its private resolver, as an oracle).
    monkeypatch.setenv("AIRFLOW_CONN_PROBE", json.dumps(stored))
    assert SparkSubmitHook(conn_id="probe")._connection["master"] == master


def settled(monkeypatch, jvm_profile: str | None) -> TidemarkJobOperator:
    """A merge task under workers whose default profile is short-jobs, after it
    settles its submit on a local master."""
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_SPARK", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    monkeypatch.setenv(JVM_PROFILE_VARIABLE, "short-jobs")
    operator = TidemarkJobOperator(task_id="merge", job="merge_late", job_args=[], jvm_profile=jvm_profile)
    operator.settle_submit()
    return operator


def test_a_task_without_a_profile_submits_under_the_workers_default(monkeypatch):
    operator = settled(monkeypatch, "")
    assert "-XX:TieredStopAtLevel=1" in operator.conf["spark.driver.extraJavaOptions"].split()
    assert JVM_PROFILE_VARIABLE not in operator.env_vars


def test_a_task_with_a_profile_submits_its_jvm_and_its_driver_under_it(monkeypatch):
    operator = settled(monkeypatch, "throughput")
    assert "TieredStopAtLevel" not in operator.conf["spark.driver.extraJavaOptions"]
    assert "spark.sql.codegen.factoryMode" not in operator.conf
    assert operator.env_vars[JVM_PROFILE_VARIABLE] == "throughput"


def test_a_continuous_stream_task_without_a_profile_submits_under_short_jobs(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_SPARK", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    monkeypatch.delenv(JVM_PROFILE_VARIABLE, raising=False)
    for trigger, c1_only in (("continuous", True), ("available-now", False)):
        operator = TidemarkJobOperator(
            task_id="pipeline", job="run", job_args=["--pipeline", "p", "--trigger", trigger], jvm_profile=""
        )
        operator.settle_submit()
        assert (
            "-XX:TieredStopAtLevel=1" in operator.conf["spark.driver.extraJavaOptions"].split()
        ) is c1_only
