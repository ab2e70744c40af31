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


# The files that take longest, longest first, by their measured durations: `make test`
# runs two workers a file at a time, and a long file started late would leave one worker
# running it alone at the end. Any other file keeps its place after these.
LONGEST_FIRST = (
    "test_production_rehearsal.py",
    "test_fault_injection.py",
    "test_merge_beside_live.py",
    "test_late_merge.py",
    "test_airflow_e2e.py",
    "test_crash_points.py",
    "test_session_tune.py",
    "test_session_engine.py",
    "test_session_crash_points.py",
    "test_live_demo.py",
    "test_sql_server.py",
    "test_silver_engine.py",
    "test_concurrent_commits.py",
    "test_bronze_ingest.py",
    "test_outages.py",
    "test_offline_detection.py",
    "test_parse.py",
    "test_spark_cluster.py",
    "test_tune.py",
    "test_object_storage.py",
    "test_source_partitions.py",
    "test_silver_matches_model.py",
    "test_airflow_ui.py",
    "test_silver_time_semantics.py",
    "test_silver_crash.py",
    "test_custom_generators.py",
    "test_driver_side_state.py",
    "test_offline_transitions.py",
    "test_bad_input_fuzz.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: place for place, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))


# The session JVM's compiler and heap. C2 pays back here, but its thread compiled every
# lukewarm method: three times the JDK's tier-4 thresholds leave C2 the hot ones. A
# serial heap grown from its initial size ran full collections early, and its small
# young generation collected often: the heap starts at its maximum (HotSpot clamps the
# initial size to -Xmx, which spark.driver.memory sets), its young generation a third of it.
SESSION_JVM_OPTIONS = (
    f"{SERIAL_COLLECTOR} {JVM_PROFILES['short-jobs'].heap_options}"
    " -XX:Tier4InvocationThreshold=15000 -XX:Tier4MinInvocationThreshold=1800"
    " -XX:Tier4CompileThreshold=45000 -XX:Tier4BackEdgeThreshold=120000"
)


@pytest.fixture(scope="session")
def spark():
    from spark_jobs.session import build_session

    with pytest.MonkeyPatch.context() as environment:
        # This JVM lives the whole run and runs most tests' queries (jobs run in-process),
        # long enough for C2 to pay back. Their batches are a few records each, so they
        # are planned as under short-jobs.
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
                # than they save.
                "spark.driver.extraJavaOptions": f"{java_options} {SESSION_JVM_OPTIONS}",
            },
        )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
