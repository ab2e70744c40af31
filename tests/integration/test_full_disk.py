"""The lakehouse on a small filesystem (a tmpfs with a size) that fills up mid-stream:
every run while it is full fails with an error that says the disk is full and damages
nothing, and once space is freed the pipeline resumes exactly where it stopped: the
tables equal those of a run on a disk that never filled."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_jobs.generator import land_files
from spark_jobs.lakehouse.checkpoints import damaged_log_files
from spark_jobs.lakehouse.commit_files import damaged_commits
from spark_jobs.tables import TableRegistry, join
from tests.integration.engine import (
    BASE_MS,
    BOUNDED,
    TUMBLING,
    assert_reconciles,
    engine_config,
    engine_history,
    engine_quarantine,
    engine_windows,
    payload,
    run_job_once,
    run_jobs,
)
from tests.integration.small_disk import fill, small_disk

pytestmark = [pytest.mark.spark]

DISK_MB = 48
STREAMS = ("bronze", "silver")
# Three landings a minute of event time apart; the third carries a record two
# minutes behind, which the 5 s bound quarantines.
LANDINGS = [
    [
        payload(partition, BASE_MS + minute * 60_000 + second * 1_000, f"d{partition}", 50.0, 1.0)
        for partition in (0, 1)
        for second in range(5)
    ]
    for minute in range(3)
]
LANDINGS[2].append(payload(0, BASE_MS + 30_000, "d0", 10.0, 2.0))


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with small_disk(tmp_path / "disk", DISK_MB) as mounted:
        yield mounted


def land(registry: TableRegistry, records: list[dict]) -> None:
    land_files([[json.dumps(record) for record in records]], registry.landing_path, "json")


def tables(spark, registry: TableRegistry) -> tuple:
    windows, quarantine = engine_windows(spark, registry), engine_quarantine(spark, registry)
    return windows, quarantine, engine_history(spark, registry)


def test_a_full_disk_fails_each_run_by_name_damages_nothing_and_freed_resumes_exactly(
    spark, tmp_path, disk, capsys
):
    config = engine_config(TUMBLING, BOUNDED)
    registry = TableRegistry(config, str(disk / "lakehouse"))
    land(registry, LANDINGS[0])
    run_jobs(spark, registry, *STREAMS)
    land(registry, LANDINGS[1])
    bronze_before = spark.read.format("delta").load(registry.bronze.path).count()

    filler = fill(disk)
    capsys.readouterr()
    # Airflow retries the task while the disk stays full: each attempt fails alike.
    for _attempt in range(2):
        assert run_job_once(spark, registry, "bronze") == 1
        error = capsys.readouterr().err
        assert "tidemark bronze: a disk is full (No space left on device)" in error
        assert f"the disk of {disk}/lakehouse (0.0 MB free)" in error
    assert spark.read.format("delta").load(registry.bronze.path).count() == bronze_before
    checkpoint = join(registry.root, "_checkpoints", config.name, "bronze")
    assert damaged_log_files(spark, checkpoint) == []
    assert damaged_commits(spark, [table.path for table in registry.all()]) == []

    filler.unlink()
    run_jobs(spark, registry, *STREAMS)
    land(registry, LANDINGS[2])
    run_jobs(spark, registry, *STREAMS)

    twin = TableRegistry(config, str(tmp_path / "never-full"))
    for landing in LANDINGS:
        land(twin, landing)
        run_jobs(spark, twin, *STREAMS)
    assert tables(spark, registry) == tables(spark, twin)
    assert_reconciles(spark, registry, [record for landing in LANDINGS for record in landing])
