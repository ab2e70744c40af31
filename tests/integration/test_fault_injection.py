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

pytestmark = [pytest.mark.spark, pytest.mark.slow]
SEED = 20261124
# Four streams on two cores: a 2 s trigger keeps their overhead from starving each other.
CONTINUOUS = ("--trigger", "continuous", "--interval", "2s")
# Every job is killed in a thread of its own, all at once. Offline detection writes only
# when silver has moved, after a heavy first batch: its kill comes slowest.
STREAM_KILLS = {"bronze": 7, "silver": 7, "gold": 2, "offline": 1}
# Beside the live streams, once the quarantine has rows to merge: a kill needs a write
# since the start, which the check's is its run-log row (it steps only when partitions idle).
BATCH_KILLS = {"merge_late": 2, "check_idle": 1}
BATCH_KILLS_AFTER = 6  # stream kills landed first
ARGUMENTS = {"check_idle": ("--stall-after", "1h")}  # a backlog mid-storm is no stall
SECONDS_AFTER_PROGRESS = (0.0, 3.0)
WRITE_TIMEOUT_S = 600
RECORDS_PER_FILE = 20
LANDING_RATE = 3.0  # records per second while the kills land: landing outlasts the storm


def writes(log: Path) -> list[str]:
    """The writes a job's log says committed, in order."""
    return re.findall(r"^tidemark: wrote (\S+)$", log.read_text(errors="replace"), re.MULTILINE)


def committed_batches(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return sum(1 for path in commits.iterdir() if path.name.isdigit()) if commits.exists() else 0


def progress(job: str, lakehouse: Path, pipeline: str):
    """Whether ``job`` has committed work since now. A stream: a micro-batch logged as
    done in its checkpoint (a replayed batch's writes are skipped by their txn ids, so
    a write alone is no progress, and a stream killed each time after one would never
    move). The merge: a data write (its run-log row comes first). The check: any write."""
    if job in STREAM_KILLS:
        checkpoint = lakehouse / "_checkpoints" / pipeline / job
        before = committed_batches(checkpoint)
        return lambda log: committed_batches(checkpoint) > before
    if job == "merge_late":
        return lambda log: any(not write.startswith("runs:") for write in writes(log))
    return lambda log: bool(writes(log))


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


def kill_after_progress(
    job: str, kills: int, pipeline: Path, lakehouse: Path, landed: list, started: list
) -> subprocess.Popen:
    """Kill ``job`` ``kills`` times, each at a seeded moment after it has committed
    work since its (re)start (see :func:`progress`); a batch job that finishes first
    is started again. Returns the job's last (re)start, left running for a stream."""
    rng = random.Random(f"{SEED}-{job}")
    for attempt in range(6 * kills):
        log = lakehouse.parent / f"{job}-{attempt}.log"
        progressed = progress(job, lakehouse, pipeline.stem)
        process = start(job, pipeline, lakehouse, log, started)
        if sum(1 for kill in landed if kill[0] == job) == kills:
            return process
        deadline = time.monotonic() + WRITE_TIMEOUT_S
        while not progressed(log) and process.poll() is None:
            assert time.monotonic() < deadline, f"{job} made no progress in {WRITE_TIMEOUT_S} s: {log}"
            time.sleep(0.2)
        if process.poll() is None:
            time.sleep(rng.uniform(*SECONDS_AFTER_PROGRESS))
        if process.poll() is None:
            kill_hard(process)
            landed.append((job, (writes(log) or ["nothing"])[-1]))
        else:
            assert process.returncode == 0, f"{job} failed on its own:\n{log.read_text()[-4000:]}"
            assert job in BATCH_KILLS, f"the {job} stream stopped on its own: {log}"
    raise AssertionError(f"{job}: fewer than {kills} kills landed after progress in {6 * kills} runs")


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
    storm_done = threading.Event()

    def keep_landing() -> None:
        # Paced while the stream kills land; whatever is left lands at once after.
        for start_at in range(head, len(fleet), RECORDS_PER_FILE):
            files = fleet[start_at : start_at + RECORDS_PER_FILE]
            write_landing(
                files, landing, RECORDS_PER_FILE, rate=None if storm_done.is_set() else LANDING_RATE
            )

    landing_thread = threading.Thread(target=keep_landing)
    landing_thread.start()
    landed: list[tuple[str, str]] = []
    started: list[subprocess.Popen] = []
    errors: list[BaseException] = []

    def storm(job: str) -> None:
        try:
            if job in BATCH_KILLS:
                wait_for(lambda: len(landed) >= BATCH_KILLS_AFTER, WRITE_TIMEOUT_S, "the first stream kills")
                finished = kill_after_progress(job, BATCH_KILLS[job], pipeline, lakehouse, landed, started)
                assert finished.wait(timeout=WRITE_TIMEOUT_S) == 0, f"{job} failed after its kills"
            else:
                kill_after_progress(job, STREAM_KILLS[job], pipeline, lakehouse, landed, started)
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=storm, args=(job,)) for job in [*STREAM_KILLS, *BATCH_KILLS]]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
    finally:
        storm_done.set()
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
