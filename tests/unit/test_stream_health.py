"""The streaming watchdog: its health signal, read from a checkpoint's files, and the kill."""

from __future__ import annotations

import os
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from tidemark_airflow.health import stalled_batch, stalled_query

LIMIT = timedelta(minutes=5)


def checkpoint(folder: Path, started: dict[int, float], committed: list[int]) -> str:
    for kind, ids in (("offsets", started), ("commits", committed)):
        (folder / kind).mkdir(parents=True, exist_ok=True)
        for batch in ids:
            path = folder / kind / str(batch)
            path.write_text("v1")
            mtime = started.get(batch, 0)
            os.utime(path, (mtime, mtime))
    (folder / "offsets" / ".1.crc").write_text("")  # Hadoop's checksum files are not batches
    return str(folder)


def test_a_stream_that_never_started_a_batch_is_not_stalled(tmp_path):
    assert stalled_batch(str(tmp_path / "missing"), LIMIT, now=1_000) is None


def test_a_stream_idle_between_batches_is_not_stalled(tmp_path):
    folder = checkpoint(tmp_path, {0: 100, 1: 200}, [0, 1])
    assert stalled_batch(folder, LIMIT, now=100_000) is None


def test_a_batch_running_within_the_limit_is_not_stalled(tmp_path):
    folder = checkpoint(tmp_path, {0: 100, 1: 1_000}, [0])
    assert stalled_batch(folder, LIMIT, now=1_000 + 299) is None


def test_a_batch_uncommitted_past_the_limit_is_stalled_and_named(tmp_path):
    folder = checkpoint(tmp_path, {0: 100, 1: 1_000}, [0])
    reason = stalled_batch(folder, LIMIT, now=1_000 + 300)
    assert reason == "micro-batch 1 has gone 300 s without committing"


def test_an_application_is_stalled_when_any_of_its_queries_is_and_names_it(tmp_path):
    checkpoint(tmp_path / "bronze", {0: 100, 1: 1_000}, [0, 1])
    checkpoint(tmp_path / "silver", {0: 100, 1: 1_000}, [0])
    assert stalled_query(str(tmp_path), LIMIT, now=1_000 + 299) is None
    reason = stalled_query(str(tmp_path), LIMIT, now=1_000 + 300)
    assert reason == "silver: micro-batch 1 has gone 300 s without committing"


def test_an_application_whose_queries_all_commit_is_not_stalled(tmp_path):
    checkpoint(tmp_path / "bronze", {0: 100, 1: 1_000}, [0, 1])
    checkpoint(tmp_path / "silver", {0: 100}, [0])
    assert stalled_query(str(tmp_path), LIMIT, now=100_000) is None


def test_a_batch_started_before_the_watch_began_gets_the_whole_limit_from_then(tmp_path):
    folder = checkpoint(tmp_path, {0: 100, 1: 1_000}, [0])  # a restart re-runs batch 1
    assert stalled_batch(folder, LIMIT, now=5_000 + 299, watched_since=5_000) is None
    reason = stalled_batch(folder, LIMIT, now=5_000 + 300, watched_since=5_000)
    assert reason == "micro-batch 1 has gone 300 s without committing"


def test_the_watchdog_kills_a_stalled_stream_and_its_task_fails_naming_the_stall(tmp_path, monkeypatch):
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    from airflow.sdk.exceptions import AirflowException
    from tidemark_airflow.operators import SupervisedStreamOperator

    checkpoint(tmp_path / "silver", {0: 100, 1: 1_000}, [0])  # batch 1 started long ago, never committed
    killed = threading.Event()

    def spark_submit(operator, context) -> None:  # runs until the watchdog kills it
        assert killed.wait(30), "the watchdog never killed the stream"
        raise AirflowException("spark-submit exited with -9")

    monkeypatch.setattr(SparkSubmitOperator, "execute", spark_submit)
    monkeypatch.setattr(SupervisedStreamOperator, "on_kill", lambda operator: killed.set())
    stream = SupervisedStreamOperator(
        task_id="continuous.pipeline",
        job="run",
        job_args=[],
        checkpoint=str(tmp_path),
        stall_after=timedelta(milliseconds=50),
        poll_interval=0.01,
    )
    with pytest.raises(AirflowException, match="stream stalled: silver: micro-batch 1 has gone"):
        stream.execute({})
