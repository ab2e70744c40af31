"""Shared fixtures: one local SparkSession for the whole run (real Spark, real Delta)."""

from __future__ import annotations

import pytest


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
