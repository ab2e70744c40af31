"""``tidemark run``: a pipeline's four streams as queries of one Spark application.
A query that fails stops the others and fails the application (its supervisor then
restarts the whole set); restarted, the application gives the answer of a batch
computation over bronze, with nothing lost and nothing doubled.

The application runs in this test's session and its crash raises
(``TIDEMARK_CRASH_BY=raise``), as in the crash-point matrix; the process-level
kills of the application are in the fault-injection storm and under Airflow."""

from __future__ import annotations

import pytest

from spark_jobs.config import load_pipeline
from spark_jobs.faults import CRASH_AFTER_VARIABLE, CRASH_BY_VARIABLE, INJECTED_CRASHES
from spark_jobs.generator import FleetSpec, Manifest, generate, malformed_kinds, write_landing
from spark_jobs.jobs import merge_late, run
from spark_jobs.jobs.common import JobContext
from spark_jobs.tables import TableRegistry
from tests.integration.conftest import assert_bronze_reconciles, write_pipeline
from tests.integration.lakehouse_sql import (
    batch_gold,
    batch_silver,
    batch_status_events,
    engine_gold,
    engine_silver,
    engine_status_events,
)
from tests.integration.test_late_merge import assert_reconciles

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def application(registry: TableRegistry, trigger: str) -> JobContext:
    return JobContext("run", registry.config, registry, trigger, 500, "unused: each query has its own")


def runs_of(spark, registry: TableRegistry) -> list:
    return (
        spark.read.format("delta")
        .load(registry.ops["runs"].path)
        .where(f"pipeline = '{registry.config.name}' AND status != 'running'")
        .collect()
    )


def test_a_failed_query_stops_its_siblings_and_the_restart_loses_and_doubles_nothing(
    spark, tmp_path, monkeypatch
):
    landing = tmp_path / "landing"
    pipeline = write_pipeline(tmp_path, source={"kind": "files", "path": str(landing), "format": "json"})
    registry = TableRegistry(load_pipeline(pipeline), str(tmp_path / "lakehouse"))
    fleet = generate(
        FleetSpec(
            devices=4, partitions=2, seed=5, duration_ms=20 * 60_000, late_ratio=0.05, malformed_ratio=0.02
        ),
        malformed_kinds("files"),
    )
    write_landing(fleet, landing, 200)

    monkeypatch.setenv(CRASH_AFTER_VARIABLE, "silver:windows")
    monkeypatch.setenv(CRASH_BY_VARIABLE, "raise")
    crashes_before = len(INJECTED_CRASHES)
    assert run.run(spark, application(registry, "continuous")) == 1
    assert INJECTED_CRASHES[crashes_before:] == ["silver:windows"]
    ended = {row.job: (row.status, row.message) for row in runs_of(spark, registry)}
    assert ended["silver"][0] == "failed" and "silver:windows" in ended["silver"][1]
    assert {job: ended[job] for job in ("bronze", "gold", "offline")} == {
        job: ("stopped", "stopped: a query beside it failed") for job in ("bronze", "gold", "offline")
    }

    monkeypatch.delenv(CRASH_AFTER_VARIABLE)
    assert run.run(spark, application(registry, "available-now"), flush=True) == 0
    assert merge_late.main(["--pipeline", str(pipeline), "--lakehouse", registry.root]) == 0
    assert_bronze_reconciles(spark, registry, Manifest.of(fleet), fleet)
    assert_reconciles(spark, registry)
    assert engine_silver(spark, registry) == batch_silver(spark, registry)
    assert engine_gold(spark, registry) == batch_gold(spark, registry)
    assert engine_status_events(spark, registry) == batch_status_events(spark, registry)
    # Each job of the restart logged its own run, under its own name.
    succeeded = [row.job for row in runs_of(spark, registry) if row.status == "succeeded"]
    assert sorted(succeeded) == ["bronze", "gold", "merge_late", "offline", "silver"]
