"""The storm: twenty SIGKILLs at seeded moments after commits, spread over every job
that writes, beside each other. A pipeline on landing files and one on Kafka with a
stateful custom generator run their streams as one application each while input
keeps arriving, and are killed again and again; maintenance is killed beside the
file pipeline's streams; then check-idle is killed while every partition is dark,
and the late merge is killed. Every job traces its committed writes
(``TIDEMARK_TRACE_WRITES``), so the test prints where each kill landed. Afterwards
both pipelines' tables reconcile exactly and equal a plain batch computation over
bronze (nothing lost, nothing doubled)."""

from __future__ import annotations

import random
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from spark_jobs.eventtime.clock import MAX_WATERMARK
from spark_jobs.faults import TRACE_WRITES_VARIABLE
from spark_jobs.generator import FleetSpec, Manifest, generate, land_files, malformed_kinds, send_to_kafka
from spark_jobs.submit import submit_env
from spark_jobs.tables import TableRegistry
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

# Six application start-ups and fourteen more jobs: give a loaded machine room beyond 900 s.
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(2400)]
SEED = 20261124
PARTITIONS = 3
# An application's start-up costs the most, so most kills fall on the other jobs.
FILE_STREAM_KILLS = 3
KAFKA_STREAM_KILLS = 3
MAINTENANCE_KILLS = 5
IDLE_CHECK_KILLS = 5
MERGE_KILLS = 4
KILLS = FILE_STREAM_KILLS + KAFKA_STREAM_KILLS + MAINTENANCE_KILLS + IDLE_CHECK_KILLS + MERGE_KILLS
CONTINUOUS = ("--trigger", "continuous", "--interval", "500ms")
# A kill lands a seeded moment after a seeded number of writes committed since the
# start, drawn from these ranges.
STREAM_KILL_AFTER = (1, 14)
MAINTENANCE_KILL_AFTER = (1, 3)
MERGE_KILL_AFTER = (1, 3)
# Check-idle's writes are its run log's start row, beside its reads, and the idleness
# step's three, which a run killed before the last takes again. A run can end before
# its kill (a step taken already leaves only reads): it is one more check, not a kill.
IDLE_CHECK_KILL_AFTER = (1, 2)
IDLE_CHECK_PAUSE_UP_TO_S = 0.5
PAUSE_UP_TO_S = 1.0
# Input arrives a chunk every few seconds all through the storm, each run releasing an
# equal share of it, so a slow machine's long runs cannot exhaust it before the last
# run starts; what is left arrives at once after it.
RECORDS_PER_CHUNK = 6
SECONDS_PER_CHUNK = 3.0
# Partitions go idle after seconds, so the idleness check has a step to take once the
# file pipeline's input has ended.
FILE_WATERMARK = {"strategy": "bounded", "max_out_of_orderness": "5s", "idleness": "3s"}
# A bound that shrinks with every batch a partition sends: its state lives in the clocks.
STATEFUL_WATERMARK = {
    "strategy": "custom",
    "generator": "user_generators:ShrinkingBound",
    "options": {"start": 60_000, "step": 10_000},
}
USER_GENERATORS = Path(__file__).parents[1] / "unit" / "user_generators.py"


def committed_writes(trace: Path) -> list[str]:
    """The writes a traced process committed, in order (``job:write``)."""
    return [line.split()[1] for line in trace.read_text().splitlines()] if trace.exists() else []


def kill_after_progress(
    job: str,
    args: tuple[str, ...],
    pipeline: Path,
    lakehouse: Path,
    trace: Path,
    after: tuple[int, int],
    rng: random.Random,
    pause_up_to: float = PAUSE_UP_TO_S,
) -> list[str] | None:
    """Start ``job`` with its writes traced; once it has committed a seeded number
    of writes (drawn from ``after``), wait a seeded moment more (up to ``pause_up_to``)
    and kill -9 it. The writes it committed, or None when it finished by itself first."""
    with trace.with_suffix(".log").open("w") as output:
        process = subprocess.Popen(
            job_command(job, pipeline, lakehouse, *args),
            env={**submit_env(), TRACE_WRITES_VARIABLE: str(trace)},
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # kill -9 takes the JVM and its Python driver
        )
    writes, pause = rng.randint(*after), rng.uniform(0.0, pause_up_to)
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


class Feeder(threading.Thread):
    """Delivers ``chunks`` one every ``SECONDS_PER_CHUNK`` while its released share
    lasts (``release``) until told to stop; then the rest at once."""

    def __init__(self, chunks: list[list], deliver: Callable[[list], None]) -> None:
        super().__init__(daemon=True)
        self.chunks, self.deliver = chunks, deliver
        self.delivered = self.released = 0
        self.stopping = threading.Event()

    def release(self, count: int) -> None:
        self.released = min(len(self.chunks), self.released + count)

    def run(self) -> None:
        while self.delivered < len(self.chunks) and not self.stopping.wait(SECONDS_PER_CHUNK):
            if self.delivered < self.released:
                self.deliver(self.chunks[self.delivered])
                self.delivered += 1

    def finish(self) -> None:
        self.stopping.set()
        self.join()
        for chunk in self.chunks[self.delivered :]:
            self.deliver(chunk)


class Storm:
    """The kills that landed, in order, with where each landed."""

    def __init__(self) -> None:
        self.kills: list[tuple[str, list[str]]] = []
        self.lock = threading.Lock()

    def landed(self, lane: str, writes: list[str] | None) -> list[str]:
        assert writes is not None, f"{lane} finished before its seeded kill"
        with self.lock:
            self.kills.append((lane, writes))
            print(f"kill {len(self.kills)} ({lane}): after {len(writes)} writes, the last {writes[-1]}")
        return writes


def last_write_per_job(writes: list[str]) -> dict[str, str]:
    return {write.split(":")[0]: write for write in writes}


def chunks_of(fleet: list) -> list[list]:
    return [fleet[start : start + RECORDS_PER_CHUNK] for start in range(0, len(fleet), RECORDS_PER_CHUNK)]


def fleet_of(seed: int, kinds_of: str) -> list:
    spec = FleetSpec(
        devices=6,
        partitions=PARTITIONS,
        seed=seed,
        duration_ms=40 * 60_000,
        late_ratio=0.05,
        malformed_ratio=0.02,
    )
    return generate(spec, malformed_kinds(kinds_of))


def stream_storm(
    storm: Storm, lane: str, pipeline: Path, lakehouse: Path, feeder: Feeder, kills: int, rng, folder: Path
) -> list[dict[str, str]]:
    """``kills`` runs of the pipeline's application, each killed mid-work while its
    share of the input arrives; the last write of each job before each kill."""
    landed, arrived = [], []
    feeder.start()
    try:
        for index in range(kills):
            before = feeder.delivered
            feeder.release(len(feeder.chunks) // kills)
            trace = folder / f"{lane}-run-{index}.trace"
            writes = kill_after_progress(
                "run", CONTINUOUS, pipeline, lakehouse, trace, STREAM_KILL_AFTER, rng
            )
            landed.append(last_write_per_job(storm.landed(lane, writes)))
            arrived.append(feeder.delivered - before)
    finally:
        feeder.finish()
    assert all(arrived), f"{lane}: input arrived during each run: {arrived}"
    return landed


def maintenance_storm(
    storm: Storm, pipeline: Path, lakehouse: Path, registry: TableRegistry, rng, folder: Path
):
    """Maintenance killed mid-OPTIMIZE beside the file pipeline's streams, once its
    tables exist."""
    wait_for(lambda: Path(registry.silver.path, "_delta_log").exists(), 600, "the file pipeline's tables")
    for index in range(MAINTENANCE_KILLS):
        trace = folder / f"maintenance-{index}.trace"
        writes = kill_after_progress(
            "maintenance", (), pipeline, lakehouse, trace, MAINTENANCE_KILL_AFTER, rng
        )
        storm.landed("maintenance", writes)


def idle_check_storm(storm: Storm, pipeline: Path, lakehouse: Path, rng, folder: Path) -> None:
    """Check-idle killed mid-work until its kills have landed, every partition dark."""
    checks = 0
    while sum(lane == "check-idle" for lane, _ in storm.kills) < IDLE_CHECK_KILLS:
        assert checks < 2 * IDLE_CHECK_KILLS, "check-idle kept ending before its kill"
        trace = folder / f"check-idle-{checks}.trace"
        checks += 1
        writes = kill_after_progress(
            *("check_idle", (), pipeline, lakehouse, trace, IDLE_CHECK_KILL_AFTER, rng),
            pause_up_to=IDLE_CHECK_PAUSE_UP_TO_S,
        )
        if writes is not None:
            storm.landed("check-idle", writes)


def merge_storm(storm: Storm, pipeline: Path, lakehouse: Path, rng, folder: Path) -> None:
    for index in range(MERGE_KILLS):
        trace = folder / f"merge-{index}.trace"
        storm.landed(
            "merge", kill_after_progress("merge_late", (), pipeline, lakehouse, trace, MERGE_KILL_AFTER, rng)
        )


def end_input(pipeline: Path, lakehouse: Path) -> None:
    """The restart after the kills drains the input in one trigger and ends it (+inf)."""
    assert run_here("run", pipeline, lakehouse, "--trigger", "available-now", "--flush").returncode == 0


def kafka_pipeline(folder: Path, kafka_broker, topic: str) -> Path:
    """The Kafka pipeline, with the user's generator module beside its file."""
    folder.mkdir()
    shutil.copy(USER_GENERATORS, folder / USER_GENERATORS.name)
    source = {
        "kind": "kafka",
        "bootstrap_servers": kafka_broker.bootstrap_servers,
        "topic": topic,
        "starting_offsets": "earliest",
        "max_offsets_per_trigger": 2 * RECORDS_PER_CHUNK,
    }
    return write_pipeline(folder, pipeline="storm_kafka", source=source, watermark=STATEFUL_WATERMARK)


def assert_exact(spark, registry: TableRegistry, fleet: list) -> list:
    """Nothing lost or doubled, and the tables of a batch computation over bronze; the
    watermark history, for the checks of the lane."""
    assert_bronze_reconciles(spark, registry, Manifest.of(fleet), fleet)
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
    return history


def test_twenty_kill_9s_over_every_job_beside_each_other_lose_and_double_nothing(
    spark, tmp_path, kafka_broker
):
    landing = tmp_path / "landing"
    files_lakehouse, kafka_lakehouse = tmp_path / "files-lakehouse", tmp_path / "kafka-lakehouse"
    files_pipeline = write_pipeline(
        tmp_path,
        pipeline="storm_files",
        source={"kind": "files", "path": str(landing), "format": "json", "max_files_per_trigger": 2},
        watermark=FILE_WATERMARK,
    )
    topic = "storm"
    kafka_broker.create_topic(topic, PARTITIONS)
    streamed_pipeline = kafka_pipeline(tmp_path / "kafka", kafka_broker, topic)
    files_registry = registry_for(files_pipeline, files_lakehouse)
    kafka_registry = registry_for(streamed_pipeline, kafka_lakehouse)
    file_fleet, kafka_fleet = fleet_of(SEED % 1000, "files"), fleet_of(SEED % 997, "kafka")
    lander = Feeder(
        [[record.line for record in chunk] for chunk in chunks_of(file_fleet)],
        lambda chunk: land_files([chunk], landing, "json"),
    )
    sender = Feeder(
        chunks_of(kafka_fleet), lambda chunk: send_to_kafka(chunk, kafka_broker.bootstrap_servers, topic)
    )
    storm = Storm()
    traces = tmp_path / "traces"
    traces.mkdir()

    # Beside each other: both applications' kills, and maintenance's beside the file
    # pipeline's streams. Each lane draws its moments from its own seeded generator.
    with ThreadPoolExecutor(max_workers=3) as lanes:
        file_kills = lanes.submit(
            stream_storm,
            *(storm, "files", files_pipeline, files_lakehouse, lander, FILE_STREAM_KILLS),
            *(random.Random(SEED), traces),
        )
        kafka_kills = lanes.submit(
            stream_storm,
            *(storm, "kafka", streamed_pipeline, kafka_lakehouse, sender, KAFKA_STREAM_KILLS),
            *(random.Random(SEED + 1), traces),
        )
        maintained = lanes.submit(
            maintenance_storm,
            *(storm, files_pipeline, files_lakehouse, files_registry, random.Random(SEED + 2), traces),
        )
        stream_kills = file_kills.result() + kafka_kills.result()
        maintained.result()

    # The file pipeline drains what landed without ending its input, so every partition
    # is dark and the idleness check has a step to take; the Kafka pipeline's input ends
    # (+inf). Then, beside each other, check-idle is killed on the one and the late
    # merge on the other.
    assert run_here("run", files_pipeline, files_lakehouse).returncode == 0
    end_input(streamed_pipeline, kafka_lakehouse)
    with ThreadPoolExecutor(max_workers=2) as lanes:
        checked = lanes.submit(
            idle_check_storm, storm, files_pipeline, files_lakehouse, random.Random(SEED + 3), traces
        )
        merged = lanes.submit(
            merge_storm, storm, streamed_pipeline, kafka_lakehouse, random.Random(SEED + 4), traces
        )
        checked.result()
        merged.result()
    assert run_here("check_idle", files_pipeline, files_lakehouse, streaming=False).returncode == 0
    end_input(files_pipeline, files_lakehouse)
    for pipeline, lakehouse in ((files_pipeline, files_lakehouse), (streamed_pipeline, kafka_lakehouse)):
        assert run_here("merge_late", pipeline, lakehouse, streaming=False).returncode == 0

    assert len(storm.kills) == KILLS
    lanes_killed = {lane for lane, _ in storm.kills}
    assert lanes_killed == {"files", "kafka", "maintenance", "check-idle", "merge"}
    # The streams' kills landed mid-work: past bronze, in silver and beyond it.
    assert {"bronze", "silver"} <= {job for kill in stream_kills for job in kill}
    assert len({kill.get("silver") for kill in stream_kills}) > 1, (
        "every kill landed after the same silver write"
    )
    # However the idleness checks were killed, their step ended once.
    file_history = assert_exact(spark, files_registry, file_fleet)
    idle_steps = [
        row
        for row in file_history
        if row.on_time_count + row.late_count == 0 and row.watermark != MAX_WATERMARK
    ]
    assert len(idle_steps) == 1 and idle_steps[0].idle_partitions == PARTITIONS, idle_steps
    assert_exact(spark, kafka_registry, kafka_fleet)
