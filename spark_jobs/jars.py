"""Maven jars resolved once at setup into local folders, so nothing fetches at run time.

``python -m spark_jobs.jars`` (run by ``make setup``) lets Spark's own Ivy
resolver fetch, with their dependencies:

- Delta and the Kafka connector into :func:`jars_dir`; the session factory and
  every spark-submit command point ``spark.jars`` at those files, and at the one
  Tidemark compiles itself (:func:`posix_fs_dir`, ``spark_jobs.posix_fs``);
- an Apache Kafka broker into :func:`kafka_jars_dir`, which tests and the demo
  run in KRaft mode on loopback (``spark_jobs.kafka_broker``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SCALA_VERSION = "2.13"
KAFKA_CONNECTOR = "org.apache.spark:spark-sql-kafka-0-10_{scala}:{spark}"
# The broker matches the kafka-clients version the Spark connector ships with.
KAFKA_BROKER = "org.apache.kafka:kafka_{scala}:3.9.2"

# Delta 4.4's pom also pulls Delta Kernel and the Unity Catalog client, with an
# old Hadoop/Jackson/log4j tree that clashes with pyspark's own jars. Path-based
# Delta tables through delta-spark need none of it.
EXCLUDED_PACKAGES = (
    "io.delta:delta-kernel-api",
    "io.delta:delta-kernel-defaults",
    "io.delta:delta-kernel-unitycatalog",
    "io.unitycatalog:unitycatalog-client",
    "io.unitycatalog:unitycatalog-hadoop",
    "org.apache.spark:spark-token-provider-kafka-0-10_{scala}",
)
# The Kafka connector 4.2.0 needs spark-token-provider-kafka-0-10 4.2.0, which
# Maven Central does not publish (nothing after 4.0.0). The 4.0.0 jar provides the
# same classes (KafkaConfigUpdater, KafkaTokenUtil) and is resolved on its own,
# without its dependencies (pyspark and the connector already bring them).
TOKEN_PROVIDER = "org.apache.spark:spark-token-provider-kafka-0-10_{scala}:4.0.0"
TOKEN_PROVIDER_EXCLUDES = ("org.apache.kafka:kafka-clients", "org.apache.hadoop:hadoop-client-runtime")


def jars_dir() -> Path:
    """``$TIDEMARK_JARS_DIR``, else a folder inside the active virtualenv, so the
    jars belong to the environment that pins pyspark and delta-spark."""
    configured = os.environ.get("TIDEMARK_JARS_DIR")
    return Path(configured) if configured else Path(sys.prefix) / "share" / "tidemark" / "jars"


def token_provider_dir() -> Path:
    return jars_dir().with_name("token-provider")


def posix_fs_dir() -> Path:
    """Tidemark's own jar, compiled at setup (spark_jobs.posix_fs)."""
    return jars_dir().with_name("posix-fs")


def kafka_jars_dir() -> Path:
    return jars_dir().with_name("kafka")


def maven_packages() -> list[str]:
    """Delta's coordinates as delta.pip_utils.configure_spark_with_delta_pip
    derives them, plus the Kafka connector of the same Spark version."""
    from importlib.metadata import version

    import pyspark

    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    delta = f"io.delta:delta-spark_{spark_minor}_{SCALA_VERSION}:{version('delta_spark')}"
    kafka = KAFKA_CONNECTOR.format(scala=SCALA_VERSION, spark=pyspark.__version__)
    return [delta, kafka]


def local_jars() -> list[str]:
    jars = []
    for folder in (jars_dir(), token_provider_dir(), posix_fs_dir()):
        found = sorted(str(path) for path in folder.glob("*.jar"))
        if not found:
            raise RuntimeError(f"no jars in {folder}: run `make setup` first")
        jars += found
    return jars


def resolve(
    packages: list[str], target: Path, excludes: tuple[str, ...] = (), beside_pyspark: bool = True
) -> list[Path]:
    """Fetch ``packages`` with Spark's Ivy resolver and copy their jars to ``target``.

    ``beside_pyspark`` drops jars pyspark already ships (they share a classpath).
    """
    from pyspark.sql import SparkSession

    with tempfile.TemporaryDirectory(prefix="tidemark-ivy-") as ivy:
        spark = (
            SparkSession.builder.master("local[1]")
            .appName("tidemark-resolve-jars")
            .config("spark.jars.packages", ",".join(packages))
            .config("spark.jars.ivy", ivy)
            .config("spark.jars.excludes", ",".join(excludes))
            .config("spark.ui.enabled", "false")
            .getOrCreate()
        )
        spark.stop()
        resolved = sorted(Path(ivy, "jars").glob("*.jar"))
        if not resolved:
            raise RuntimeError("Ivy resolved no jars; is Maven Central reachable?")
        staging = target.with_name(target.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        bundled = {_artifact(jar.name) for jar in _pyspark_jars()} if beside_pyspark else set()
        for jar in resolved:
            # Ivy names jars group_artifact-version.jar; pyspark's own are artifact-version.jar.
            if _artifact(jar.name.split("_", 1)[1]) not in bundled:
                shutil.copy2(jar, staging / jar.name)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return sorted(target.glob("*.jar"))


TARGETS = ("spark", "token-provider", "kafka")
# How main() runs one target in the process it starts for it.
IN_PROCESS = "--in-process"


def resolve_one(which: str) -> list[Path]:
    if which == "spark":
        excludes = tuple(e.format(scala=SCALA_VERSION) for e in EXCLUDED_PACKAGES)
        return resolve(maven_packages(), jars_dir(), excludes)
    if which == "token-provider":
        return resolve(
            [TOKEN_PROVIDER.format(scala=SCALA_VERSION)], token_provider_dir(), TOKEN_PROVIDER_EXCLUDES
        )
    return resolve([KAFKA_BROKER.format(scala=SCALA_VERSION)], kafka_jars_dir(), beside_pyspark=False)


def _pyspark_jars() -> list[Path]:
    import pyspark

    return sorted(Path(pyspark.__file__).parent.joinpath("jars").glob("*.jar"))


def _artifact(file_name: str) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients``."""
    return re.sub(r"-\d[^-]*(-[A-Za-z0-9.]+)?\.jar$", "", file_name)


def main(argv: list[str]) -> None:
    """Resolve the named targets (``spark``, ``token-provider``, ``kafka``; none: all),
    each in a process of its own (Ivy runs when a JVM starts, and a Python process keeps
    its first JVM), side by side: each mostly waits on Maven Central (all three: 35.7 s
    one after another, 24.9 side by side). One line per target; Ivy's and Spark's output
    only when a resolution fails."""
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
