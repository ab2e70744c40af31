"""Several JVMs committing to one table at once on ``file:``: every version is one
writer's commit, and every commit lands exactly once. Delta's own log store keeps
two commits of a version apart only inside one JVM (a check, then a rename that
replaces its target); Tidemark's links the version into place, which fails where
it exists. Delta's store loses a race here now and then: of JVMs writing the same
versions of a log at the same moments, two have each been told they wrote a
version, or a winner's file held the loser's commit."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spark_jobs.lakehouse.transaction import Transaction
from tests.integration.concurrent_writer import SCHEMA

pytestmark = [pytest.mark.spark, pytest.mark.slow]

WRITERS = ("a", "b")
COMMITS = 30


def log_entries(table: Path) -> list[tuple[int, list[dict]]]:
    """(version, actions) of every commit file in the table's log, read as JSON lines."""
    return [
        (int(entry.stem), [json.loads(line) for line in entry.read_text().splitlines()])
        for entry in sorted((table / "_delta_log").glob("*.json"))
    ]


def test_writers_in_two_jvms_committing_at_once_each_land_every_commit_once(spark, tmp_path):
    table = tmp_path / "table"
    assert Transaction(spark, str(table)).create(SCHEMA, [], {"delta.checkpointInterval": "1000"})
    signals = tmp_path / "signals"
    signals.mkdir()
    writers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.concurrent_writer",
                str(table),
                name,
                str(COMMITS),
                str(signals),
                *WRITERS,
            ]
        )
        for name in WRITERS
    ]
    try:
        assert [writer.wait(timeout=300) for writer in writers] == [0] * len(WRITERS)
    finally:
        for writer in writers:
            writer.kill()

    entries = log_entries(table)
    total = len(WRITERS) * COMMITS
    assert [version for version, _ in entries] == list(range(total + 1))
    transactions = collections.Counter(
        (action["txn"]["appId"], action["txn"]["version"])
        for _, actions in entries
        for action in actions
        if "txn" in action
    )
    expected = {(name, n) for name in WRITERS for n in range(COMMITS)}
    assert set(transactions) == expected
    assert set(transactions.values()) == {1}
    rows = collections.Counter(tuple(row) for row in spark.read.format("delta").load(str(table)).collect())
    assert set(rows) == expected
    assert set(rows.values()) == {1}
    assert not list((table / "_delta_log").glob(".*.tmp")), "a temporary commit file was left behind"


RACERS = ("a", "b")
RACED_VERSIONS = 1000


def race(log: Path, store_class: str, work: Path) -> dict[str, set[int]]:
    """The versions each racer's JVM won when all wrote every version at once."""
    log.mkdir()
    racers = {
        name: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.log_store_racer",
                *(str(log), store_class, name, str(RACED_VERSIONS), "0.01", str(work / f"{name}.won")),
            ]
        )
        for name in RACERS
    }
    try:
        deadline = time.monotonic() + 120
        while not all((work / f"{name}.ready").exists() for name in RACERS):
            assert time.monotonic() < deadline, "a racer's session did not start"
            assert all(racer.poll() is None for racer in racers.values()), "a racer exited before the start"
            time.sleep(0.1)
        start = str(time.time() + 1)
        for name in RACERS:
            (work / f"{name}.start").write_text(start)
        assert [racer.wait(timeout=120) for racer in racers.values()] == [0] * len(RACERS)
    finally:
        for racer in racers.values():
            racer.kill()
    return {name: set(json.loads((work / f"{name}.won").read_text())) for name in RACERS}


def test_of_jvms_writing_one_log_version_at_once_exactly_one_wins_and_its_file_stays(tmp_path):
    log = tmp_path / "_delta_log"
    won = race(log, "io.tidemark.fs.LocalLogStore", tmp_path)
    winners = collections.Counter(version for versions in won.values() for version in versions)
    assert set(winners) == set(range(RACED_VERSIONS))
    assert set(winners.values()) == {1}
    for name, versions in won.items():
        for version in versions:
            assert json.loads((log / f"{version:020d}.json").read_text()) == {"writer": name}
