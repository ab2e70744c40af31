"""A Delta table's last commit file that a crash of the machine left incomplete (empty, or
cut short): every job stops before it writes, naming the file and ``tidemark repair``.
The repair removes it where the stream batch that wrote it runs again, and the stream then
resumes exactly, nothing lost or doubled; where it cannot tell, or another stream read
that version, it refuses and removes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_jobs.jobs import repair
from spark_jobs.lakehouse.commit_files import DamagedCommits
from spark_jobs.tables import TableRegistry
from tests.integration.engine import run_job_once
from tests.integration.test_damaged_checkpoints import (
    bronze_seconds,
    land,
    landed_and_ingested,
    last_file,
)

pytestmark = [pytest.mark.spark]


def last_commit(registry: TableRegistry) -> Path:
    log = Path(registry.bronze.path, "_delta_log")
    return max(log.glob("[0-9]*.json"), key=lambda path: int(path.stem))


def cut(path: Path, damage: str) -> None:
    """Empty the file, or cut it inside the actions after its first line (a crash keeps
    whole pages of a file: a commit of many files keeps its ``commitInfo``)."""
    text = path.read_bytes()
    first_line = text.index(b"\n") + 1
    path.write_bytes(b"" if damage == "empty" else text[: first_line + (len(text) - first_line) // 2])


def restarted(spark) -> None:
    """What a new process would see: no table state cached from before the crash."""
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()


def repaired(spark, registry: TableRegistry, monkeypatch, capsys) -> tuple[int, str, str]:
    monkeypatch.setattr(repair, "load_pipeline", lambda _: registry.config)
    code = repair.main(["--pipeline", registry.config.name, "--lakehouse", registry.root])
    restarted(spark)
    output = capsys.readouterr()
    return code, output.out, output.err


def test_a_cut_last_commit_stops_every_job_by_name_and_a_repair_resumes_the_stream_exactly(
    spark, tmp_path, capsys, monkeypatch
):
    registry = landed_and_ingested(spark, tmp_path, 3)
    damaged = last_commit(registry)
    cut(damaged, "cut")
    land(registry, 3)
    restarted(spark)

    for job in ("bronze", "silver"):
        with pytest.raises(DamagedCommits) as stopped:
            run_job_once(spark, registry, job)
        assert f"the Delta commit file {damaged} is damaged" in str(stopped.value)
        assert f"`tidemark repair --pipeline {registry.config.name} --lakehouse" in str(stopped.value)

    # The crash also lost the checkpoint's record of the batch, or it did not: either way
    # the batch runs again.
    code, out, err = repaired(spark, registry, monkeypatch, capsys)
    assert code == 0, err
    assert f"removed {damaged}" in out
    assert "/bronze/commits/2\n" in out
    assert not damaged.exists()

    assert run_job_once(spark, registry, "bronze") == 0
    assert bronze_seconds(spark, registry) == [0, 1, 2, 3]


def test_an_empty_last_commit_names_no_writer_and_the_repair_refuses(spark, tmp_path, capsys, monkeypatch):
    registry = landed_and_ingested(spark, tmp_path, 2)
    damaged = last_commit(registry)
    cut(damaged, "empty")
    restarted(spark)

    code, _, err = repaired(spark, registry, monkeypatch, capsys)
    assert code == 1
    assert f"{damaged} is damaged, but what is left of it does not say which writer made it" in err
    assert "tidemark replay" in err
    assert damaged.exists() and damaged.read_bytes() == b""
    with pytest.raises(DamagedCommits):
        run_job_once(spark, registry, "bronze")


def test_a_damaged_commit_another_stream_read_is_left_and_the_repair_refuses(
    spark, tmp_path, capsys, monkeypatch
):
    registry = landed_and_ingested(spark, tmp_path, 2)
    assert run_job_once(spark, registry, "silver") == 0
    damaged = last_commit(registry)
    commits = last_file(registry, "commits")
    cut(damaged, "cut")
    restarted(spark)

    code, _, err = repaired(spark, registry, monkeypatch, capsys)
    assert code == 1
    assert f"the silver stream may have read version {int(damaged.stem)}" in err
    assert damaged.exists() and commits.exists()
