"""Fault injection: every job killed with SIGKILL at seeded random moments, 20 times
in all, each time restarted; then the tables reconcile exactly and equal a plain
batch computation over bronze (nothing lost, nothing doubled)."""

from __future__ import annotations

import random
import subprocess
import time
from pathlib import Path

import pytest

from spark_jobs.eventtime.clock import MAX_WATERMARK
from spark_jobs.generator import FleetSpec, Manifest, generate, malformed_kinds, write_landing
from spark_jobs.submit import submit_env
from tests.integration.conftest import (
    assert_bronze_reconciles,
    job_command,
    kill_hard,
    registry_for,
    run_job,
    write_pipeline,
)
from tests.integration.lakehouse_sql import (
    batch_gold,
    batch_silver,
    batch_status_events,
    engine_gold,
    engine_silver,
    engine_status_events,
)
from tests.integration.test_late_merge import assert_reconciles, quarantine_by_status

pytestmark = [pytest.mark.spark, pytest.mark.slow]
SEED = 20261123
CONTINUOUS = ("--trigger", "continuous", "--interval", "500ms")
# (job, kills that must land, seconds after start drawn from): streams run until
# killed, so a draw past their start-up lands mid-work; batch jobs may finish first
# and are started again until their kills land.
STORM = (
    ("bronze", 5, (8.0, 20.0)),
    ("silver", 5, (8.0, 20.0)),
    ("gold", 3, (8.0, 20.0)),
    ("offline", 3, (8.0, 20.0)),
    ("merge_late", 2, (5.0, 15.0)),
    ("check_idle", 2, (5.0, 12.0)),
)
STREAMS = ("bronze", "silver", "gold", "offline")


def kill_until_landed(job: str, pipeline: Path, lakehouse: Path, kills: int, delays, rng) -> list[float]:
    """Start ``job`` and kill -9 it after a seeded random delay until ``kills`` kills
    hit a running process; returns the delays of the kills that landed."""
    landed: list[float] = []
    args = CONTINUOUS if job in STREAMS else ()
    for _ in range(4 * kills):
        if len(landed) == kills:
            break
        delay = rng.uniform(*delays)
        log = lakehouse.parent / f"{job}-{len(landed)}.log"
        with log.open("w") as output:
            process = subprocess.Popen(
                job_command(job, pipeline, lakehouse, *args),
                env=submit_env(),
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # kill -9 takes the JVM and its Python driver
            )
            time.sleep(delay)
        if process.poll() is None:
            kill_hard(process)
            landed.append(delay)
        else:
            assert process.returncode == 0, f"{job} failed on its own:\n{log.read_text()[-4000:]}"
    return landed


def test_twenty_seeded_kill_9s_across_every_job_lose_and_double_nothing(spark, tmp_path):
    landing, lakehouse = tmp_path / "landing", tmp_path / "lakehouse"
    pipeline = write_pipeline(
        tmp_path, source={"kind": "files", "path": str(landing), "format": "json", "max_files_per_trigger": 2}
    )
    registry = registry_for(pipeline, lakehouse)
    fleet = generate(
        FleetSpec(
            devices=6,
            partitions=3,
            seed=SEED % 1000,
            duration_ms=40 * 60_000,
            late_ratio=0.05,
            malformed_ratio=0.02,
        ),
        malformed_kinds("files"),
    )
    write_landing(fleet, landing, 20)
    manifest = Manifest.of(fleet)
    rng = random.Random(SEED)

    landed = {}
    for job, kills, delays in STORM:
        landed[job] = kill_until_landed(job, pipeline, lakehouse, kills, delays, rng)
        # The restart after the last kill runs the job to the end of its input.
        if job == "silver":
            run_job(job, pipeline, lakehouse, "--trigger", "available-now", "--flush")
        else:
            run_job(job, pipeline, lakehouse, streaming=job in STREAMS)
    print({job: [round(delay, 1) for delay in delays] for job, delays in landed.items()})
    assert {job: len(delays) for job, delays in landed.items()} == {job: k for job, k, _ in STORM}
    assert sum(len(delays) for delays in landed.values()) >= 20

    assert_bronze_reconciles(spark, registry, manifest, fleet)
    statuses = quarantine_by_status(spark, registry)
    assert set(statuses) == {"merged"} and statuses["merged"] > 0
    assert_reconciles(spark, registry)
    assert engine_silver(spark, registry) == batch_silver(spark, registry)
    assert engine_gold(spark, registry) == batch_gold(spark, registry)
    assert engine_status_events(spark, registry) == batch_status_events(spark, registry)
    history = (
        spark.read.format("delta")
        .load(registry.ops["watermark_history"].path)
        .where(f"pipeline = '{registry.config.name}'")
        .collect()
    )
    # Every bronze record judged exactly once across the kills and restarts (one
    # tumbling window each), and no batch that judged records recorded twice.
    judged = sum(row.on_time_count + row.late_count for row in history)
    assert judged == spark.read.format("delta").load(registry.bronze.path).count()
    batches = [row.batch_id for row in history if row.on_time_count + row.late_count > 0]
    assert len(batches) == len(set(batches)), "a silver batch was recorded twice"
    # The input ended with the flush (+inf): the idleness checks after it took no step.
    assert [row.watermark for row in history].count(MAX_WATERMARK) == 1
