"""A class-data-sharing archive of the JVM classes a Tidemark job loads.

A Spark driver loads thousands of classes before its first record; parsing and
verifying them is most of a job's start-up on a small machine. ``python -m
spark_jobs.jvm_archive`` (run by ``make setup``) replays a tiny pipeline once in a
JVM that writes every class it loaded into :func:`archive_path` when it exits
(JDK 13+ dynamic CDS). Every later driver maps the archive instead of loading
those classes again (:func:`driver_java_options`).

The archive belongs to the environment, like the jars: the JVM checks that it was
made by the same Java build over the same class path and otherwise ignores it
(``-Xshare:auto``), so a stale archive costs nothing but the saving. Classes of
``spark.jars`` (Delta, Kafka) come through Spark's own class loader, which the
JVM does not archive.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from contextlib import suppress
from pathlib import Path

from spark_jobs.jvm import DUMP_VARIABLE, archive_path

TRAINING_RECORDS, TRAINING_BATCHES = 24, 4


def train(work: Path) -> None:
    """The training workload: a tiny generated pipeline replayed with ``--flush``
    (bronze, silver, gold, offline: the classes of every job). The JVM then exits
    by itself, which is when it writes the archive (PySpark would kill it)."""
    from py4j.protocol import Py4JError

    from spark_jobs.generator import FleetSpec, generate
    from spark_jobs.jobs import replay

    records = generate(FleetSpec(devices=3, partitions=2, seed=3, duration_ms=80_000))[:TRAINING_RECORDS]
    source = work / "records.json"
    source.write_text("\n".join(record.line for record in records) + "\n")
    pipeline = Path(__file__).with_name("pipelines") / "telemetry.yaml"
    arguments = ["--pipeline", str(pipeline), "--input", str(source), "--lakehouse", str(work / "lakehouse")]
    if replay.main([*arguments, "--batch-size", str(TRAINING_RECORDS // TRAINING_BATCHES), "--flush"]):
        raise RuntimeError("the training replay failed")
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    SparkContext.getOrCreate().stop()
    with suppress(Py4JError, ConnectionError):  # the JVM left while answering (py4j retries)
        gateway.jvm.System.exit(0)
    gateway.proc.wait(timeout=600)


def build(archive: Path) -> None:
    """Run :func:`train` in a child process whose driver dumps its classes; the
    archive is renamed into place only when complete."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="tidemark-jvm-archive-") as work:
        training = subprocess.run(
            [sys.executable, "-m", "spark_jobs.jvm_archive", "--train", work],
            env={**os.environ, DUMP_VARIABLE: str(partial)},
            capture_output=True,
            text=True,
        )
    if training.returncode != 0:
        raise RuntimeError(f"the training run failed:\n{training.stderr[-5000:]}")
    if not partial.is_file():
        raise RuntimeError(f"the training run exited without writing {partial}")
    partial.replace(archive)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--train"]:
        train(Path(argv[1]))
        return
    archive = archive_path()
    build(archive)
    print(f"tidemark: JVM class archive {archive} ({archive.stat().st_size // 2**20} MiB)")


if __name__ == "__main__":
    main(sys.argv[1:])
