"""`tidemark check-idle`: quiet streams get their due windows and OFFLINE timers
fired, stalled streams are reported. The checks run in this process (the soak runs
them spark-submitted, under Airflow)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from spark_jobs.config import parse_pipeline
from spark_jobs.generator import FleetSpec, generate, write_landing
from spark_jobs.jobs import offline
from spark_jobs.jobs.check_idle import STALLED_EXIT
from spark_jobs.jobs.common import JobContext
from spark_jobs.tables import TableRegistry, join
from tests.integration.conftest import Ran, registry_for, run_here, write_pipeline
from tests.integration.engine import assert_reconciles, engine_document, payload, replay_batches
from tests.integration.test_offline_detection import OFFLINE, TUMBLING, at, status_events

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def check_idle(pipeline: Path, lakehouse: Path, *extra: str) -> Ran:
    return run_here("check_idle", pipeline, lakehouse, *extra, streaming=False)


def history(spark, registry: TableRegistry) -> list[tuple]:
    rows = spark.sql(
        f"SELECT batch_id, watermark, active_partitions, idle_partitions "
        f"FROM delta.`{registry.ops['watermark_history'].path}` "
        f"WHERE pipeline = '{registry.config.name}' ORDER BY watermark"
    ).collect()
    return [tuple(row) for row in rows]


def window_statuses(spark, registry: TableRegistry) -> dict[int, str]:
    rows = spark.sql(f"SELECT unix_millis(window_start) AS start, status FROM delta.`{registry.silver.path}`")
    return {row.start: row.status for row in rows.collect()}


def test_a_stream_that_stops_gets_its_due_windows_and_offline_timers_fired_by_the_check(spark, tmp_path):
    # Bird's scooter sends on partition 0; another scooter sent once on partition 1
    # at 17:30:00 and stopped. Partition 1 holds the watermark back until it is idle.
    bird = [
        payload(0, ts, "scooter-1", 80.0, 10.0) for ts in (at("17:30:15"), at("17:30:25"), at("18:00:32"))
    ]
    quiet = payload(1, at("17:30:00"), "scooter-2", 60.0, 0.0)
    watermark = {"strategy": "bounded", "max_out_of_orderness": "5s", "idleness": "2s"}
    document = engine_document(TUMBLING, watermark, offline=OFFLINE)
    config = parse_pipeline(document)
    pipeline = tmp_path / f"{config.name}.yaml"
    pipeline.write_text(yaml.safe_dump(document))
    registry = replay_batches(spark, config, tmp_path, [[quiet, *bird]])
    held = at("17:30:00") - 5_000 - 1
    assert [step[1] for step in history(spark, registry)] == [held]
    assert status_events(spark, registry) == []
    assert window_statuses(spark, registry)[at("17:30:00")] == "open"

    time.sleep(2.5)  # both partitions quiet for longer than the idleness timeout
    checked = check_idle(pipeline, tmp_path)
    assert checked.returncode == 0, checked.stdout[-3000:]
    # All partitions idle: the watermark moves to the largest partition watermark.
    advanced = at("18:00:32") - 5_000 - 1
    assert history(spark, registry)[-1][1:] == (advanced, 0, 2)
    windows = window_statuses(spark, registry)
    assert windows[at("17:30:00")] == "closed" and windows[at("18:00:00")] == "open"

    # The offline stream takes the check's step through its usual code path.
    checkpoint = join(registry.root, "_checkpoints", config.name, "offline")
    assert (
        offline.run(spark, JobContext("offline", config, registry, "available-now", 1_000, checkpoint)) == 0
    )
    assert status_events(spark, registry) == [
        ("scooter-2", "offline", at("18:00:00"), advanced),
        ("scooter-1", "offline", at("18:00:25"), advanced),
    ]
    again = check_idle(pipeline, tmp_path)
    assert again.returncode == 0 and "watermark unchanged" in again.stdout
    assert_reconciles(spark, registry, [quiet, *bird])


def test_a_stalled_stream_with_a_backlog_is_reported_and_its_watermark_left_alone(spark, tmp_path):
    landing, lakehouse = tmp_path / "landing", tmp_path / "lakehouse"
    pipeline = write_pipeline(tmp_path, source={"kind": "files", "path": str(landing), "format": "json"})
    registry = registry_for(pipeline, lakehouse)
    fleet = generate(FleetSpec(devices=3, partitions=2, seed=4, duration_ms=10 * 60_000))
    write_landing(fleet, landing, 100)
    # A name a path spells otherwise (URL-encoded: a%20day%2520.json) is still one file.
    first = sorted(landing.iterdir())[0]
    first.rename(landing / "a day%20.json")
    # Files bronze reads without a row in bronze: one of rejects only, one of nothing.
    bad_lines = ["not json", '{"device_id": ']
    (landing / "rejects-only.json").write_text("".join(f"{line}\n" for line in bad_lines))
    (landing / "empty.json").write_text("")
    landed = len(list(landing.iterdir()))
    time.sleep(1.5)

    # Nothing ingested the landing files: bronze is stalled.
    stalled = check_idle(pipeline, lakehouse, "--stall-after", "1s")
    assert stalled.returncode == STALLED_EXIT, stalled.stdout[-3000:]
    # spark-submit runs the Python driver with its stderr merged into stdout.
    assert f"stalled: bronze: {landed} landing files unread" in stalled.stdout

    # Bronze ran, silver did not: silver is stalled and the check leaves its clock alone.
    assert run_here("bronze", pipeline, lakehouse).returncode == 0
    ingested = spark.read.format("delta").load(registry.bronze.path).count()
    rejected = spark.read.format("delta").load(registry.ops["rejects"].path).count()
    assert ingested + rejected == len(fleet) + len(bad_lines)
    time.sleep(1.5)
    stalled = check_idle(pipeline, lakehouse, "--stall-after", "1s")
    assert stalled.returncode == STALLED_EXIT
    assert "bronze:" not in stalled.stdout and "stalled: silver: " in stalled.stdout
    assert "silver busy" in stalled.stdout
    assert history(spark, registry) == []

    # A recent backlog is not a stall yet.
    assert check_idle(pipeline, lakehouse, "--stall-after", "1h").returncode == 0
    runs = spark.sql(
        f"SELECT status, count(*) AS n FROM delta.`{registry.ops['runs'].path}` "
        "WHERE job = 'check_idle' AND status <> 'running' GROUP BY status"
    ).collect()
    assert {row.status: row.n for row in runs} == {"failed": 2, "succeeded": 1}
