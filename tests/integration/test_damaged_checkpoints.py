"""A checkpoint log file that a crash of the machine left incomplete (empty, or cut
in half): the stream stops with an error that names the file and ``tidemark
repair``; the repair removes it where that is safe, and the stream then resumes
exactly, nothing lost or doubled. Where a table already took the batch whose offsets
are damaged, the repair refuses and removes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_jobs.generator import land_files
from spark_jobs.jobs import repair
from spark_jobs.tables import TableRegistry
from tests.integration.engine import BASE_MS, engine_config, payload, run_job_once

pytestmark = [pytest.mark.spark]


def landed_and_ingested(spark, tmp_path: Path, batches: int) -> TableRegistry:
    """A pipeline whose bronze took ``batches`` micro-batches, one record each."""
    config = engine_config({"type": "tumbling", "size": "10s", "offset": "0s"}, {"strategy": "monotonous"})
    registry = TableRegistry(config, str(tmp_path / "lakehouse"))
    for second in range(batches):
        land(registry, second)
        assert run_job_once(spark, registry, "bronze") == 0
    return registry


def land(registry: TableRegistry, second: int) -> None:
    record = payload(0, BASE_MS + second * 1000, "d1", 1.0, 1.0)
    land_files([[json.dumps(record)]], registry.landing_path, "json")


def last_file(registry: TableRegistry, folder: str) -> Path:
    logs = Path(registry.root, "_checkpoints", registry.config.name, "bronze", folder)
    return max((path for path in logs.iterdir() if path.name.isdigit()), key=lambda path: int(path.name))


def bronze_seconds(spark, registry: TableRegistry) -> list[int]:
    rows = spark.read.format("delta").load(registry.bronze.path).select("ts").collect()
    return sorted((row.ts - BASE_MS) // 1000 for row in rows)


def repair_args(registry: TableRegistry) -> list[str]:
    return ["--pipeline", registry.config.name, "--lakehouse", registry.root, "--job", "bronze"]


@pytest.mark.parametrize("folder", ["offsets", "commits"])
@pytest.mark.parametrize("damage", ["empty", "cut in half"])
def test_a_damaged_last_log_file_stops_the_stream_by_name_and_a_repair_resumes_it_exactly(
    spark, tmp_path, capsys, monkeypatch, folder, damage
):
    registry = landed_and_ingested(spark, tmp_path, 3)
    last = last_file(registry, folder)
    text = last.read_bytes()
    # The machine crashed while writing the file: the commit of the last batch (which
    # every table took), or the offsets of the next one (which no table took yet).
    damaged = last if folder == "commits" else last.with_name(str(int(last.name) + 1))
    damaged.write_bytes(b"" if damage == "empty" else text[: len(text) // 2])
    land(registry, 3)
    capsys.readouterr()

    assert run_job_once(spark, registry, "bronze") == 1
    error = capsys.readouterr().err
    assert f"the checkpoint file file:{damaged} is damaged" in error or f"file {damaged} is damaged" in error
    assert f"tidemark repair --pipeline {registry.config.name}" in error
    assert bronze_seconds(spark, registry) == [0, 1, 2]

    # The repair reads the pipeline by name from this test's pipelines.
    monkeypatch.setattr(repair, "load_pipeline", lambda _: registry.config)
    assert repair.main(repair_args(registry)) == 0
    assert f"bronze: removed {damaged}" in capsys.readouterr().out
    assert not damaged.exists()

    assert run_job_once(spark, registry, "bronze") == 0
    assert bronze_seconds(spark, registry) == [0, 1, 2, 3]


def test_a_damaged_offsets_file_of_a_batch_a_table_took_is_left_and_the_repair_fails(
    spark, tmp_path, capsys, monkeypatch
):
    registry = landed_and_ingested(spark, tmp_path, 3)
    # The last batch committed to bronze; its commit file is gone and its offsets cut.
    last_file(registry, "commits").unlink()
    offsets = last_file(registry, "offsets")
    text = offsets.read_bytes()
    offsets.write_bytes(text[: len(text) // 2])
    capsys.readouterr()

    monkeypatch.setattr(repair, "load_pipeline", lambda _: registry.config)
    assert repair.main(repair_args(registry)) == 1
    assert f"batch 2 of this stream committed to {registry.bronze.path}" in capsys.readouterr().err
    assert offsets.read_bytes() == text[: len(text) // 2]
