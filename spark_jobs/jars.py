"""Maven jars resolved once at setup into local folders, so nothing fetches at run time.

``python -m spark_jobs.jars`` (run by ``make setup``) fetches:

- Delta and the Kafka connector into :func:`jars_dir`, pinned jar by jar with their
  SHA-256 (:data:`SPARK_JARS`); the session factory and every spark-submit command
  point ``spark.jars`` at those files, and at the one Tidemark compiles itself
  (:func:`tidemark_jar_dir`, ``spark_jobs.java_build``);
- an Apache Kafka broker into :func:`kafka_jars_dir`, with its dependencies through
  Spark's own Ivy resolver, which tests and the demo run in KRaft mode on loopback
  (``spark_jobs.kafka_broker``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

SCALA_VERSION = "2.13"
KAFKA_CONNECTOR = "org.apache.spark:spark-sql-kafka-0-10_{scala}:{spark}"
# The broker matches the kafka-clients version the Spark connector ships with.
KAFKA_BROKER = "org.apache.kafka:kafka_{scala}:3.9.2"

MAVEN_CENTRAL = "https://repo1.maven.org/maven2"


@dataclass(frozen=True)
class PinnedJar:
    """One Maven Central jar, ``group:artifact:version``, and the SHA-256 it must have."""

    coordinates: str
    sha256: str

    def url(self) -> str:
        group, artifact, version = self.coordinates.split(":")
        return f"{MAVEN_CENTRAL}/{group.replace('.', '/')}/{artifact}/{version}/{artifact}-{version}.jar"

    def file_name(self) -> str:
        """Ivy's name for it, ``group_artifact-version.jar``."""
        group, artifact, version = self.coordinates.split(":")
        return f"{group}_{artifact}-{version}.jar"


# Delta for pyspark's Spark and the Kafka connector of the same Spark (maven_packages),
# with the dependencies pyspark does not ship, as Spark's Ivy resolver found them. Two
# of their poms' dependencies are left out. Delta 4.4's pom also pulls Delta Kernel
# and the Unity Catalog client, with an old Hadoop/Jackson/log4j tree that clashes
# with pyspark's own jars; path-based Delta tables through delta-spark need none of
# it. The connector 4.2.0 needs spark-token-provider-kafka-0-10 4.2.0, which Maven
# Central does not publish (nothing after 4.0.0): the 4.0.0 jar provides the same
# classes (KafkaConfigUpdater, KafkaTokenUtil), in a folder of its own. Fetched one
# by one instead of through Ivy, whose JVM start kept a fresh setup waiting before the
# class archive could start.
SPARK_JARS = (
    PinnedJar(
        "io.delta:delta-spark_4.2_2.13:4.4.0",
        "27d4fd8b1f879535c573ed1c718177d6a27f24d3e626ba02e216369725721ead",
    ),
    PinnedJar(
        "io.delta:delta-storage:4.4.0",
        "c46735481fa8e326b0957be02b4420cbcab4b325bb08009b7f2045a95133f1cc",
    ),
    PinnedJar(
        "org.apache.commons:commons-pool2:2.13.1",
        "f77a5060d6936a9144023584232f9de3f2248f1abfe156e9d31795f18770674f",
    ),
    PinnedJar(
        "org.apache.kafka:kafka-clients:3.9.2",
        "014b4ef36884478a932641818b080c36a8f8e2e92dc771e800c9d2694f4f83d8",
    ),
    PinnedJar(
        "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0",
        "64539c45e5d39f7ddb747312c239f38f5208d08c1a0ddf7d70beb2fbd9373705",
    ),
)
TOKEN_PROVIDER_JARS = (
    PinnedJar(
        "org.apache.spark:spark-token-provider-kafka-0-10_2.13:4.0.0",
        "f2be3b76f9e6cbe63379d4e4e0dc14f59dbf056ae2ad16ff15ac108004c86767",
    ),
)


def jars_dir() -> Path:
    """``$TIDEMARK_JARS_DIR``, else a folder inside the active virtualenv, so the
    jars belong to the environment that pins pyspark and delta-spark."""
    configured = os.environ.get("TIDEMARK_JARS_DIR")
    return Path(configured) if configured else Path(sys.prefix) / "share" / "tidemark" / "jars"


def token_provider_dir() -> Path:
    return jars_dir().with_name("token-provider")


def tidemark_jar_dir() -> Path:
    """Tidemark's own jar, compiled at setup (spark_jobs.java_build)."""
    return jars_dir().with_name("tidemark-java")


def kafka_jars_dir() -> Path:
    return jars_dir().with_name("kafka")


def maven_packages() -> list[str]:
    """Delta's coordinates as delta.pip_utils.configure_spark_with_delta_pip
    derives them from the installed pyspark and delta-spark, plus the Kafka connector
    of the same Spark version: what :data:`SPARK_JARS` must pin."""
    from importlib.metadata import version

    import pyspark

    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    delta = f"io.delta:delta-spark_{spark_minor}_{SCALA_VERSION}:{version('delta_spark')}"
    kafka = KAFKA_CONNECTOR.format(scala=SCALA_VERSION, spark=pyspark.__version__)
    return [delta, kafka]


def local_jars() -> list[str]:
    jars = []
    for folder in (jars_dir(), token_provider_dir(), tidemark_jar_dir()):
        found = sorted(str(path) for path in folder.glob("*.jar"))
        if not found:
            raise RuntimeError(f"no jars in {folder}: run `make setup` first")
        jars += found
    return jars


def filled_folder(target: Path, fill: Callable[[Path], None]) -> list[Path]:
    """Replace ``target`` with a folder ``fill`` writes in full; a failed fill leaves
    ``target`` as it was."""
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    fill(staging)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return sorted(target.glob("*.jar"))


def fetch(pins: tuple[PinnedJar, ...], target: Path) -> list[Path]:
    """Download ``pins`` from Maven Central side by side into ``target``, each checked
    against its SHA-256."""

    def download(pin: PinnedJar, folder: Path) -> None:
        with urllib.request.urlopen(pin.url(), timeout=300) as response:
            content = response.read()
        digest = hashlib.sha256(content).hexdigest()
        if digest != pin.sha256:
            raise RuntimeError(
                f"{pin.url()} has SHA-256 {digest}; {pin.coordinates} is pinned at {pin.sha256}"
            )
        (folder / pin.file_name()).write_bytes(content)

    def fill(folder: Path) -> None:
        with ThreadPoolExecutor(max_workers=len(pins)) as pool:
            for done in [pool.submit(download, pin, folder) for pin in pins]:
                done.result()

    return filled_folder(target, fill)


def resolve(packages: list[str], target: Path) -> list[Path]:
    """Fetch ``packages`` with their dependencies through Spark's Ivy resolver into ``target``."""
    from pyspark.sql import SparkSession

    with tempfile.TemporaryDirectory(prefix="tidemark-ivy-") as ivy:
        spark = (
            SparkSession.builder.master("local[1]")
            .appName("tidemark-resolve-jars")
            .config("spark.jars.packages", ",".join(packages))
            .config("spark.jars.ivy", ivy)
            .config("spark.ui.enabled", "false")
            .getOrCreate()
        )
        spark.stop()
        resolved = sorted(Path(ivy, "jars").glob("*.jar"))
        if not resolved:
            raise RuntimeError("Ivy resolved no jars; is Maven Central reachable?")

        def fill(folder: Path) -> None:
            for jar in resolved:
                shutil.copy2(jar, folder / jar.name)

        return filled_folder(target, fill)


TARGETS = ("spark", "token-provider", "kafka")
# How main() runs one target in the process it starts for it.
IN_PROCESS = "--in-process"


def resolve_one(which: str) -> list[Path]:
    if which == "spark":
        return fetch(SPARK_JARS, jars_dir())
    if which == "token-provider":
        return fetch(TOKEN_PROVIDER_JARS, token_provider_dir())
    return resolve([KAFKA_BROKER.format(scala=SCALA_VERSION)], kafka_jars_dir())


def _pyspark_jars() -> list[Path]:
    import pyspark

    return sorted(Path(pyspark.__file__).parent.joinpath("jars").glob("*.jar"))


def main(argv: list[str]) -> None:
    """Fetch the named targets (``spark``, ``token-provider``, ``kafka``; none: all),
    each in a process of its own (Ivy runs when a JVM starts, and a Python process keeps
    its first JVM), side by side. One line per target; the output of Ivy and Spark only
    when a target fails."""
    if argv[:1] == [IN_PROCESS]:
        jars = list(resolve_one(argv[1]))
        print(f"tidemark: {len(jars)} {argv[1]} jars in {jars[0].parent if jars else '-'}")
        return
    targets = argv or list(TARGETS)
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown:
        raise SystemExit(f"tidemark: unknown jar targets {unknown}; choose from {list(TARGETS)}")
    resolving = {
        which: subprocess.Popen(
            [sys.executable, "-m", "spark_jobs.jars", IN_PROCESS, which],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for which in targets
    }
    failed = []
    for which, process in resolving.items():
        output, _ = process.communicate()
        if process.returncode != 0:
            sys.stderr.write(output)
            failed.append(f"{which} (exit {process.returncode})")
        else:
            print(output.strip().splitlines()[-1])
    if failed:
        raise SystemExit(f"tidemark: resolving the jars failed: {', '.join(failed)}")


if __name__ == "__main__":
    main(sys.argv[1:])
