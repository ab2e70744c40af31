"""Several JVMs committing to one table at once, on ``file:`` and on S3: every
version is one writer's commit, and every commit lands exactly once.

Delta's own log stores keep two commits of a version apart only inside one JVM (a
check, then a rename or a put that replaces its target). Tidemark's link the version
into place on ``file:`` (which fails where it exists) and put it only if absent on
S3 (``If-None-Match``). Delta's stores lose a race here now and then: of JVMs
writing the same versions of a log at the same moments, two have each been told
they wrote a version, or a winner's file held the loser's commit."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyarrow import fs

from spark_jobs.lakehouse.transaction import Transaction
from tests.integration.concurrent_writer import SCHEMA

pytestmark = [pytest.mark.spark, pytest.mark.slow]

WRITERS = ("a", "b")
RACERS = ("a", "b")


@dataclass(frozen=True)
class Store:
    """Where a test's tables live: the URI Spark and Hadoop take, the same place as
    pyarrow sees it, and the environment a writer's JVM needs to get there."""

    uri: str
    filesystem: fs.FileSystem
    path: str
    environment: dict[str, str]
    log_store: str
    # Commits each writer lands: a commit on S3 is a dozen round trips, ten times one on file:.
    commits: int
    # Versions a racer writes, one every step_s, each up to jitter_s late at random. On
    # S3 a won put takes some 30 ms and a lost one (the refused put, a look, py4j's
    # error) 100: racers on one schedule drifted apart and one won every version; with
    # the jitter each wins some. On file: a jitter of a millisecond parts the racers:
    # Delta's store then passed, and without one it failed every run.
    raced_versions: int
    step_s: float
    jitter_s: float

    def read(self, relative: str) -> str:
        with self.filesystem.open_input_stream(f"{self.path}/{relative}") as stream:
            return stream.read().decode()

    def names(self, relative: str) -> list[str]:
        found = self.filesystem.get_file_info(fs.FileSelector(f"{self.path}/{relative}"))
        return sorted(info.base_name for info in found)


@pytest.fixture(params=["file", "s3a"])
def store(request, tmp_path) -> Store:
    if request.param == "file":
        folder = str(tmp_path / "store")
        return Store(
            folder, fs.LocalFileSystem(), folder, {}, "io.tidemark.fs.LocalLogStore", 30, 1000, 0.01, 0.0
        )
    server = request.getfixturevalue("s3_server")
    prefix = f"{server.bucket}/commits-{uuid.uuid4().hex}"
    return Store(
        f"s3a://{prefix}",
        server.filesystem(),
        prefix,
        server.environment(),
        "io.tidemark.fs.ObjectStoreLogStore",
        10,
        60,
        0.2,
        0.005,
    )


def log_entries(store: Store, table: str) -> list[tuple[int, list[dict]]]:
    """(version, actions) of every commit file in the table's log, read as JSON lines."""
    log = f"{table}/_delta_log"
    return [
        (
            int(name.removesuffix(".json")),
            [json.loads(line) for line in store.read(f"{log}/{name}").splitlines()],
        )
        for name in store.names(log)
        if name.endswith(".json") and not name.startswith(".")
    ]


def test_writers_in_two_jvms_committing_at_once_each_land_every_commit_once(spark, store, tmp_path):
    table = f"{store.uri}/table"
    assert Transaction(spark, table).create(SCHEMA, [], {"delta.checkpointInterval": "1000"})
    signals = tmp_path / "signals"
    signals.mkdir()
    writers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.concurrent_writer",
                *(table, name, str(store.commits), str(signals), *WRITERS),
            ],
            env={**os.environ, **store.environment},
        )
        for name in WRITERS
    ]
    try:
        assert [writer.wait(timeout=300) for writer in writers] == [0] * len(WRITERS)
    finally:
        for writer in writers:
            writer.kill()

    entries = log_entries(store, "table")
    total = len(WRITERS) * store.commits
    assert [version for version, _ in entries] == list(range(total + 1))
    transactions = collections.Counter(
        (action["txn"]["appId"], action["txn"]["version"])
        for _, actions in entries
        for action in actions
        if "txn" in action
    )
    expected = {(name, n) for name in WRITERS for n in range(store.commits)}
    assert set(transactions) == expected
    assert set(transactions.values()) == {1}
    rows = collections.Counter(tuple(row) for row in spark.read.format("delta").load(table).collect())
    assert set(rows) == expected
    assert set(rows.values()) == {1}
    leftovers = [
        name
        for name in store.names("table/_delta_log")
        if name.endswith(".tmp") or name.startswith(".tidemark-conditional-put")
    ]
    assert not leftovers, "a temporary or probe object was left behind"


def race(store: Store, work: Path) -> dict[str, set[int]]:
    """The versions each racer's JVM won when all wrote every version at once."""
    racers = {
        name: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.log_store_racer",
                *(f"{store.uri}/_delta_log", store.log_store, name, str(store.raced_versions)),
                *(str(store.step_s), str(store.jitter_s), str(work / f"{name}.won")),
            ],
            env={**os.environ, **store.environment},
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
        # Written aside and renamed: a racer polling for the file must never read it empty.
        for name in RACERS:
            aside = work / f"{name}.start.partial"
            aside.write_text(start)
            aside.rename(work / f"{name}.start")
        assert [racer.wait(timeout=120) for racer in racers.values()] == [0] * len(RACERS)
    finally:
        for racer in racers.values():
            racer.kill()
    return {name: set(json.loads((work / f"{name}.won").read_text())) for name in RACERS}


def test_of_jvms_writing_one_log_version_at_once_exactly_one_wins_and_its_file_stays(store, tmp_path):
    if store.filesystem.type_name == "local":
        Path(store.path, "_delta_log").mkdir(parents=True)
    won = race(store, tmp_path)
    winners = collections.Counter(version for versions in won.values() for version in versions)
    assert set(winners) == set(range(store.raced_versions))
    assert set(winners.values()) == {1}
    for name, versions in won.items():
        for version in versions:
            assert json.loads(store.read(f"_delta_log/{version:020d}.json")) == {"writer": name}
