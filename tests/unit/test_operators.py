"""How Tidemark's operators read the Spark connection: the master it stands for, as
the Spark provider reads it, and local or not."""

from __future__ import annotations

import json

import pytest
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from tidemark_airflow.operators import spark_master

from spark_jobs.session import is_local_master

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
