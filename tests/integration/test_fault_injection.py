"""Fault injection: 20 SIGKILLs across every job, each landing mid-work, then the
tables reconcile exactly and equal a plain batch computation over bronze (nothing
lost, nothing doubled).

The four streams run side by side, continuously, while files keep landing; merges
and idleness checks run beside them. Each kill comes only after the job has
committed a write since its (re)start, at a seeded moment after it, and the job is
restarted at once. The jobs trace their writes (``TIDEMARK_TRACE_WRITES``), so the
test prints, for every kill, the last write that had committed."""

from __future__ import annotations

import random
import re
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from spark_jobs.eventtime.clock import MAX_WATERMARK
from spark_jobs.generator import FleetSpec, Manifest, generate, malformed_kinds, write_landing
from spark_jobs.jobs.common import TRACE_WRITES_VARIABLE
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
SEED = 20261124
CONTINUOUS = ("--trigger", "continuous", "--interval", "500ms")
STREAM_KILLS = {"bronze": 5, "silver": 5, "gold": 3, "offline": 3}
# Beside the live streams, after theirs: a kill needs a write since the start, which
# the check's is its run-log row (it steps the watermark only when partitions idle).
BATCH_KILLS = {"merge_late": 2, "check_idle": 2}
ARGUMENTS = {"check_idle": ("--stall-after", "1h")}  # a backlog mid-storm is no stall
SECONDS_AFTER_A_WRITE = (0.0, 2.0)
WRITE_TIMEOUT_S = 300
RECORDS_PER_FILE = 20
LANDING_RATE = 6.0  # records per second while the kills land


def writes(log: Path) -> list[str]:
    """The writes a job's log says committed, in order."""
    return re.findall(r"^tidemark: wrote (\S+)$", log.read_text(errors="replace"), re.MULTILINE)


def has_written(job: str, log: Path) -> bool:
    """A stream must have written data (its run-log row comes before any work)."""
    done = writes(log)
    return bool(done) if job == "check_idle" else any(not w.startswith("runs:") for w in done)


def start(job: str, pipeline: Path, lakehouse: Path, log: Path, started: list) -> subprocess.Popen:
    """Start ``job``, remembered in ``started`` so that nothing outlives the test."""
    args = CONTINUOUS if job in STREAM_KILLS else ARGUMENTS.get(job, ())
    with log.open("w") as output:
        process = subprocess.Popen(
            job_command(job, pipeline, lakehouse, *args),
            env={**submit_env(), TRACE_WRITES_VARIABLE: "1"},
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # kill -9 takes the JVM and its Python driver
        )
    started.append(process)
    return process


def kill_after_writes(
    job: str, kills: int, pipeline: Path, lakehouse: Path, landed: list, started: list
) -> subprocess.Popen:
    """Kill ``job`` ``kills`` times, each at a seeded moment after its first write
    since its (re)start; a batch job that finishes first is started again. Returns
    the job's last (re)start, left running for a stream."""
    rng = random.Random(f"{SEED}-{job}")
    for attempt in range(6 * kills):
        log = lakehouse.parent / f"{job}-{attempt}.log"
        process = start(job, pipeline, lakehouse, log, started)
        if sum(1 for kill in landed if kill[0] == job) == kills:
            return process
        deadline = time.monotonic() + WRITE_TIMEOUT_S
        while not has_written(job, log) and process.poll() is None:
            assert time.monotonic() < deadline, f"{job} wrote nothing in {WRITE_TIMEOUT_S} s: {log}"
            time.sleep(0.2)
        if process.poll() is None:
            time.sleep(rng.uniform(*SECONDS_AFTER_A_WRITE))
        if process.poll() is None:
            kill_hard(process)
            landed.append((job, writes(log)[-1]))
        else:
            assert process.returncode == 0, f"{job} failed on its own:\n{log.read_text()[-4000:]}"
            assert job in BATCH_KILLS, f"the {job} stream stopped on its own: {log}"
    raise AssertionError(f"{job}: fewer than {kills} kills landed after a write in {6 * kills} runs")


def test_twenty_kill_9s_each_after_a_write_across_every_job_lose_and_double_nothing(spark, tmp_path):
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
            duration_ms=60 * 60_000,
            late_ratio=0.05,
            malformed_ratio=0.02,
        ),
        malformed_kinds("files"),
    )
    manifest = Manifest.of(fleet)
    head = len(fleet) // 4
    write_landing(fleet[:head], landing, RECORDS_PER_FILE)
    streams_done = threading.Event()

    def keep_landing() -> None:
        # Paced while the stream kills land; whatever is left lands at once after.
        for start_at in range(head, len(fleet), RECORDS_PER_FILE):
            files = fleet[start_at : start_at + RECORDS_PER_FILE]
            write_landing(
                files, landing, RECORDS_PER_FILE, rate=None if streams_done.is_set() else LANDING_RATE
            )

    landing_thread = threading.Thread(target=keep_landing)
    landing_thread.start()
    landed: list[tuple[str, str]] = []
    started: list[subprocess.Popen] = []
    errors: list[BaseException] = []

    def storm(job: str) -> None:
        try:
            kill_after_writes(job, STREAM_KILLS[job], pipeline, lakehouse, landed, started)
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=storm, args=(job,)) for job in STREAM_KILLS]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        streams_done.set()
        assert not errors, errors
        for job, kills in BATCH_KILLS.items():  # beside the live streams
            finished = kill_after_writes(job, kills, pipeline, lakehouse, landed, started)
            assert finished.wait(timeout=600) == 0, f"{job} failed after its kills"
    finally:
        streams_done.set()
        landing_thread.join()
        for process in started:
            if process.poll() is None:
                kill_hard(process)

    for job, write in landed:
        print(f"kill -9 {job:<10} after {write}")
    assert Counter(job for job, _ in landed) == {**STREAM_KILLS, **BATCH_KILLS}  # 20 kills
    # The restarts after the last kills run every job to the end of its input.
    run_job("bronze", pipeline, lakehouse)
    run_job("silver", pipeline, lakehouse, "--trigger", "available-now", "--flush")
    for job in ("gold", "offline"):
        run_job(job, pipeline, lakehouse)
    run_job("merge_late", pipeline, lakehouse, streaming=False)

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
    # The input ended with the flush (+inf), recorded once.
    assert [row.watermark for row in history].count(MAX_WATERMARK) == 1
