"""The streaming watchdog's health signal, read from a checkpoint's files."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

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
    assert reason == "micro-batch 1 started 300 s ago and has not committed"


def test_an_application_is_stalled_when_any_of_its_queries_is_and_names_it(tmp_path):
    checkpoint(tmp_path / "bronze", {0: 100, 1: 1_000}, [0, 1])
    checkpoint(tmp_path / "silver", {0: 100, 1: 1_000}, [0])
    assert stalled_query(str(tmp_path), LIMIT, now=1_000 + 299) is None
    reason = stalled_query(str(tmp_path), LIMIT, now=1_000 + 300)
    assert reason == "silver: micro-batch 1 started 300 s ago and has not committed"


def test_an_application_whose_queries_all_commit_is_not_stalled(tmp_path):
    checkpoint(tmp_path / "bronze", {0: 100, 1: 1_000}, [0, 1])
    checkpoint(tmp_path / "silver", {0: 100}, [0])
    assert stalled_query(str(tmp_path), LIMIT, now=100_000) is None
