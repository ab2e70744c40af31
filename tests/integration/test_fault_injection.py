"""Fault injection mid-work: a pipeline's streams run as one application while files
keep landing, and are killed with SIGKILL at seeded moments, each only after the
application has committed a write since its (re)start; then the late merge is
killed the same way. Every job traces its committed writes
(``TIDEMARK_TRACE_WRITES``), so the test prints where each kill landed. Afterwards
the tables reconcile exactly and equal a plain batch computation over bronze
(nothing lost, nothing doubled)."""

from __future__ import annotations

import random
import subprocess
import threading
import time
from pathlib import Path

import pytest

from spark_jobs.eventtime.clock import MAX_WATERMARK
from spark_jobs.faults import TRACE_WRITES_VARIABLE
from spark_jobs.generator import FleetSpec, Manifest, generate, land_files, malformed_kinds
from spark_jobs.submit import submit_env
from tests.integration.conftest import (
    assert_bronze_reconciles,
    job_command,
    kill_hard,
    registry_for,
    run_here,
    wait_for,
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

# Five application start-ups and two merges: give a loaded machine room beyond 900 s.
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(2400)]
SEED = 20261124
STREAM_KILLS = 4
MERGE_KILLS = 1
CONTINUOUS = ("--trigger", "continuous", "--interval", "500ms")
# A kill lands a seeded moment (up to a second) after a seeded number of writes
# committed since the start, drawn from these ranges.
STREAM_KILL_AFTER = (1, 14)
MERGE_KILL_AFTER = (1, 3)
# Files land one every few seconds all through the storm, each run releasing an equal
# share of them, so a slow machine's long runs cannot exhaust the fleet before the
# last run starts; what is left lands at once after it.
RECORDS_PER_FILE = 6
SECONDS_PER_FILE = 3.0


def committed_writes(trace: Path) -> list[str]:
    """The writes a traced process committed, in order (``job:write``)."""
    return [line.split()[1] for line in trace.read_text().splitlines()] if trace.exists() else []


def kill_after_progress(
    job: str, args: tuple[str, ...], pipeline: Path, lakehouse: Path, trace: Path, after: tuple, rng
) -> list[str] | None:
    """Start ``job`` with its writes traced; once it has committed a seeded number
    of writes (drawn from ``after``), wait a seeded moment more and kill -9 it. The
    writes it committed, or None when it finished by itself before the kill."""
    with trace.with_suffix(".log").open("w") as output:
        process = subprocess.Popen(
            job_command(job, pipeline, lakehouse, *args),
            env={**submit_env(), TRACE_WRITES_VARIABLE: str(trace)},
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # kill -9 takes the JVM and its Python driver
        )
    writes, pause = rng.randint(*after), rng.uniform(0.0, 1.0)
    try:
        wait_for(
            lambda: len(committed_writes(trace)) >= writes or process.poll() is not None,
            600,
            f"{job} to commit {writes} writes",
            interval=0.1,
        )
        time.sleep(pause)
    finally:
        if process.poll() is None:
            kill_hard(process)
            killed = True
        else:
            killed = False
    log = trace.with_suffix(".log").read_text()
    assert process.returncode in (0, -9), f"{job} failed on its own:\n{log[-4000:]}"
    return committed_writes(trace) if killed else None


class Lander(threading.Thread):
    """Lands ``files`` one every ``SECONDS_PER_FILE`` while its released share lasts
    (``release``) until told to stop; then the rest at once."""

    def __init__(self, files: list[list[str]], landing: Path) -> None:
        super().__init__(daemon=True)
        self.files, self.landing = files, landing
        self.landed = self.released = 0
        self.stopping = threading.Event()

    def release(self, count: int) -> None:
        self.released = min(len(self.files), self.released + count)

    def run(self) -> None:
        while self.landed < len(self.files) and not self.stopping.wait(SECONDS_PER_FILE):
            if self.landed < self.released:
                land_files([self.files[self.landed]], self.landing, "json")
                self.landed += 1

    def finish(self) -> None:
        self.stopping.set()
        self.join()
        land_files(self.files[self.landed :], self.landing, "json")


def last_write_per_job(writes: list[str]) -> dict[str, str]:
    return {write.split(":")[0]: write for write in writes}


def test_kill_9s_mid_work_while_files_land_lose_and_double_nothing(spark, tmp_path):
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
    manifest = Manifest.of(fleet)
    rng = random.Random(SEED)
    files = [fleet[start : start + RECORDS_PER_FILE] for start in range(0, len(fleet), RECORDS_PER_FILE)]
    lander = Lander([[record.line for record in file] for file in files], landing)
    lander.start()

    kills: list[dict[str, str]] = []
    landed_during_each_run = []
    try:
        for index in range(STREAM_KILLS):
            trace = tmp_path / f"run-{index}.trace"
            landed_before = lander.landed
            lander.release(len(files) // STREAM_KILLS)
            writes = kill_after_progress(
                "run", CONTINUOUS, pipeline, lakehouse, trace, STREAM_KILL_AFTER, rng
            )
            assert writes is not None, "a continuous application ended by itself"
            landed_during_each_run.append(lander.landed - landed_before)
            kills.append(last_write_per_job(writes))
            print(f"kill {index + 1}: after {len(writes)} writes; last of each job: {kills[-1]}")
    finally:
        lander.finish()
    # The restart after the last kill drains the input in one trigger and ends it (+inf).
    unlimited = write_pipeline(tmp_path, source={"kind": "files", "path": str(landing), "format": "json"})
    assert run_here("run", unlimited, lakehouse, "--trigger", "available-now", "--flush").returncode == 0

    merge_kills = []
    for index in range(MERGE_KILLS):
        trace = tmp_path / f"merge-{index}.trace"
        writes = kill_after_progress("merge_late", (), pipeline, lakehouse, trace, MERGE_KILL_AFTER, rng)
        assert writes is not None, "the merge finished before its seeded kill"
        merge_kills.append(writes[-1])
        print(f"merge kill {index + 1}: after {writes}")
    assert run_here("merge_late", pipeline, lakehouse, streaming=False).returncode == 0

    assert all(landed_during_each_run), f"files landed during each run: {landed_during_each_run}"
    # The kills landed mid-work: past bronze, in silver and beyond it.
    jobs_written = {job for kill in kills for job in kill}
    assert {"bronze", "silver"} <= jobs_written
    assert len({kill.get("silver") for kill in kills}) > 1, "every kill landed after the same silver write"
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
    assert [row.watermark for row in history].count(MAX_WATERMARK) == 1
