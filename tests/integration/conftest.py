"""Real components for integration tests: spark-submit jobs, a KRaft Kafka broker,
pipeline files pointing at temporary lakehouses."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, redirect_stderr, redirect_stdout, suppress
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path

import pytest
import yaml

from spark_jobs.config import load_pipeline
from spark_jobs.generator import Manifest
from spark_jobs.kafka_broker import KafkaBroker
from spark_jobs.object_store import S3Server
from spark_jobs.submit import submit_command, submit_env
from spark_jobs.tables import TableRegistry
from tests.integration.browser import chromium  # noqa: F401 (a fixture for the browser tests)

PIPELINES = Path(__file__).resolve().parents[2] / "spark_jobs" / "pipelines"


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka")).start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory, spark):
    """A real S3 server (SeaweedFS) on loopback, with its bucket ``lake``. The shared
    session reaches it through its Hadoop settings; jobs started as processes need
    ``s3_server.environment()``."""
    server = S3Server(tmp_path_factory.mktemp("s3")).start()
    configuration = spark._jsc.hadoopConfiguration()
    for key, value in server.hadoop_conf().items():
        configuration.set(key, value)
    yield server
    server.stop()


def write_pipeline(folder: Path, base: str = "telemetry", **sections) -> Path:
    """A copy of a shipped pipeline file with some top-level sections replaced."""
    document = yaml.safe_load((PIPELINES / f"{base}.yaml").read_text())
    document.update(sections)
    path = folder / f"{document['pipeline']}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def job_command(job: str, pipeline: Path, lakehouse: Path, *extra: str) -> list[str]:
    return submit_command(job, ["--pipeline", str(pipeline), "--lakehouse", str(lakehouse), *extra])


def run_job(
    job: str, pipeline: Path, lakehouse: Path, *extra: str, timeout: float = 600, streaming: bool = True
) -> str:
    """spark-submit a job to completion (a stream runs available-now unless told otherwise);
    its output."""
    args = extra or (("--trigger", "available-now") if streaming else ())
    done = subprocess.run(
        job_command(job, pipeline, lakehouse, *args),
        env=submit_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{job} exited {done.returncode}:\n{done.stderr[-5000:]}"
    return done.stdout


@dataclass
class Ran:
    returncode: int
    stdout: str  # and stderr, as spark-submit merges the Python driver's


def run_here(job: str, pipeline: Path, lakehouse: Path, *extra: str, streaming: bool = True) -> Ran:
    """Run a job's ``main`` in this process, on the tests' session, where the process
    itself is not what is under test (a spark-submit costs a JVM start-up). A stream
    runs available-now unless told otherwise."""
    args = extra or (("--trigger", "available-now") if streaming else ())
    output = io.StringIO()
    with redirect_stdout(output), redirect_stderr(output):
        code = import_module(f"spark_jobs.jobs.{job}").main(
            ["--pipeline", str(pipeline), "--lakehouse", str(lakehouse), *args]
        )
    return Ran(code, output.getvalue())


@contextmanager
def group_running(command: list[str], env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """A long-running command in its own process group (so kill -9 takes it all), taken
    down with its group when the block ends, however it ends: a job left running
    after a failed wait takes a core from every test after it."""
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        yield process
    finally:
        kill_hard(process)


def job_running(job: str, pipeline: Path, lakehouse: Path, *extra: str) -> AbstractContextManager:
    """spark-submit a long-running job for the length of a ``with`` block."""
    return group_running(job_command(job, pipeline, lakehouse, *extra), submit_env())


def kill_hard(process: subprocess.Popen) -> None:
    """kill -9 a process group; one already gone is not an error."""
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


def delta_commits(table_path: str) -> int:
    log = Path(table_path) / "_delta_log"
    return len(list(log.glob("*.json"))) if log.exists() else 0


def wait_for(condition, timeout: float, what: str, interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def registry_for(pipeline: Path, lakehouse: Path) -> TableRegistry:
    return TableRegistry(load_pipeline(pipeline), str(lakehouse))


def assert_bronze_reconciles(spark, registry: TableRegistry, manifest: Manifest, generated) -> None:
    """Nothing lost, nothing doubled: generated = bronze + rejects, record for record."""
    bronze = spark.read.format("delta").load(registry.bronze.path)
    rejects = (
        spark.read.format("delta")
        .load(registry.ops["rejects"].path)
        .where(f"pipeline = '{registry.config.name}'")
    )
    bronze_count, reject_count = bronze.count(), rejects.count()
    assert bronze_count + reject_count == manifest.records
    assert bronze_count == manifest.valid
    assert bronze.select("event_id").distinct().count() == bronze_count
    assert {r.reason: r["count"] for r in rejects.groupBy("reason").count().collect()} == manifest.rejected
    expected = Counter((g.payload["device_id"], g.payload["ts"]) for g in generated if g.reason is None)
    actual = Counter(
        (r.device_id, r.event_time_ms)
        for r in bronze.selectExpr("device_id", "unix_millis(event_time) AS event_time_ms").collect()
    )
    assert actual == expected
    assert bronze.where("event_time IS NULL OR ingest_time IS NULL OR processing_time IS NULL").count() == 0
