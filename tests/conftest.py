"""Shared fixtures: one local SparkSession for the whole run (real Spark, real Delta).

Airflow reads its configuration once, when first imported: this process gets a
throwaway AIRFLOW_HOME with the repository's DAGs and plugins, before any test
module can import Airflow."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="tidemark-airflow-home-")
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "dags")
os.environ["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(REPO / "plugins")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ.setdefault("AIRFLOW_CONN_TIDEMARK_SPARK", '{"conn_type": "spark", "host": "local[2]"}')


@pytest.fixture(scope="session")
def spark():
    from spark_jobs.session import build_session

    session = build_session(
        "tidemark-tests",
        master="local[2]",
        overrides={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"},
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
