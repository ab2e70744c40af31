"""Shared fixtures: one local SparkSession for the whole run (real Spark, real Delta).

Airflow reads its configuration once, when first imported: this process gets a
throwaway AIRFLOW_HOME with the repository's DAGs and plugins, before any test
module can import Airflow."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from spark_jobs.session import JVM_PROFILE_VARIABLE, JVM_PROFILES, SERIAL_COLLECTOR, SMALL_BATCHES, base_conf

# Inert unless $TIDEMARK_CPU_REPORT names where to write (see the module).
pytest_plugins = ["tests.tools.cpu_accounting"]

REPO = Path(__file__).resolve().parents[1]
os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="tidemark-airflow-home-")
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "dags")
os.environ["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(REPO / "plugins")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ.setdefault("AIRFLOW_CONN_TIDEMARK_SPARK", '{"conn_type": "spark", "host": "local[2]"}')
# The suite's spark-submitted jobs last seconds over a few records, on CI's two
# cores: the JIT compiler and collector threads of the default profile cost more CPU
# than the jobs. Every JVM the suite starts inherits the short-jobs profile (its
# spark-submits, Airflow's tasks), except the session below; `make bench` measures
# the default profile.
os.environ.setdefault(JVM_PROFILE_VARIABLE, "short-jobs")


# The files that take longest, longest first (their mean wall seconds in two whole runs of
# session 66, `--durations`): `make test` runs two workers a file at a time, and a long
# file started late would leave one worker running it alone (`test_parse.py`, 99 s,
# started last when it was not listed: the workers ended 73 s apart). Any other file
# keeps its place after these.
LONGEST_FIRST = (
    "test_fault_injection.py",  # 332
    "test_airflow_soak.py",  # 326
    "test_late_merge.py",  # 239
    "test_airflow_e2e.py",  # 232
    "test_crash_points.py",  # 191
    "test_live_demo.py",  # 187
    "test_sql_server.py",  # 176
    "test_silver_engine.py",  # 124
    "test_bronze_ingest.py",  # 122
    "test_offline_detection.py",  # 97
    "test_parse.py",  # 96
    "test_spark_cluster.py",  # 94
    "test_tune.py",  # 88
    "test_source_partitions.py",  # 63
    "test_silver_matches_model.py",  # 58
    "test_airflow_ui.py",  # 51
    "test_silver_time_semantics.py",  # 44
    "test_silver_crash.py",  # 38
    "test_custom_generators.py",  # 31
    "test_driver_side_state.py",  # 28
    "test_offline_transitions.py",  # 27
    "test_bad_input_fuzz.py",  # 25
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: place for place, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))


# The session JVM's compiler and heap, measured on three in-process test files
# (offline detection, silver engine, late merge: 23 tests) by the JVM's threads.
# C2 pays back here (C1 alone: 553 CPU-s against 453-535), but its thread compiled
# every lukewarm method: 127-148 of those CPU-s. Three times the JDK's tier-4
# thresholds leave C2 the hot ones. A serial heap grown from its initial size ran 8
# full collections in the first 90 s, and its small young generation collected
# often: the heap starts at its maximum (HotSpot clamps the initial size to -Xmx, which
# spark.driver.memory sets), its young generation a third of it. Together (measured
# with -Xms2g -Xmn640m, the same heap at 2 GB): 417-427 CPU-s (compiler 92-96,
# collector 14-15 instead of 24-26).
SESSION_JVM_OPTIONS = (
    f"{SERIAL_COLLECTOR} {JVM_PROFILES['short-jobs'].heap_options}"
    " -XX:Tier4InvocationThreshold=15000 -XX:Tier4MinInvocationThreshold=1800"
    " -XX:Tier4CompileThreshold=45000 -XX:Tier4BackEdgeThreshold=120000"
)


@pytest.fixture(scope="session")
def spark():
    from spark_jobs.session import build_session

    with pytest.MonkeyPatch.context() as environment:
        # This JVM lives the whole run and runs most tests' queries (jobs run in-process):
        # under C1 alone the in-process tests took up to twice as long. Their batches are
        # a few records each, so they are planned as under short-jobs.
        environment.setenv(JVM_PROFILE_VARIABLE, "throughput")
        java_options = base_conf()["spark.driver.extraJavaOptions"]
        session = build_session(
            "tidemark-tests",
            master="local[2]",
            overrides={
                "spark.ui.enabled": "false",
                "spark.sql.shuffle.partitions": "2",
                **SMALL_BATCHES,
                # One long-lived driver on two cores: G1's concurrent threads cost it more
                # than they save. Five in-process tests (late merge, crash points) took
                # 213 and 240 CPU-s with the serial collector against 254 and 262 with G1.
                "spark.driver.extraJavaOptions": f"{java_options} {SESSION_JVM_OPTIONS}",
            },
        )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
