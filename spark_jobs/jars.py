"""Maven jars resolved once at setup into a local folder, so Spark starts offline.

``python -m spark_jobs.jars`` (run by ``make setup``) lets Spark's own Ivy
resolver fetch Delta and the Kafka connector with their dependencies into a
scratch folder, then copies the jar files to :func:`jars_dir`. The session
factory and every spark-submit command point ``spark.jars`` at those files.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

SCALA_VERSION = "2.13"
KAFKA_CONNECTOR = "org.apache.spark:spark-sql-kafka-0-10_{scala}:{spark}"

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


def jars_dir() -> Path:
    """``$TIDEMARK_JARS_DIR``, else a folder inside the active virtualenv, so the
    jars belong to the environment that pins pyspark and delta-spark."""
    configured = os.environ.get("TIDEMARK_JARS_DIR")
    return Path(configured) if configured else Path(sys.prefix) / "share" / "tidemark" / "jars"


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
    folder = jars_dir()
    jars = sorted(str(path) for path in folder.glob("*.jar"))
    if not jars:
        raise RuntimeError(f"no jars in {folder}: run `make setup` (python -m spark_jobs.jars) first")
    return jars


def resolve(target: Path | None = None) -> list[Path]:
    """Fetch the packages with Spark's Ivy resolver and copy the jars to ``target``."""
    from pyspark.sql import SparkSession

    target = target or jars_dir()
    with tempfile.TemporaryDirectory(prefix="tidemark-ivy-") as ivy:
        spark = (
            SparkSession.builder.master("local[1]")
            .appName("tidemark-resolve-jars")
            .config("spark.jars.packages", ",".join(maven_packages()))
            .config("spark.jars.ivy", ivy)
            .config("spark.jars.excludes", ",".join(EXCLUDED_PACKAGES).format(scala=SCALA_VERSION))
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
        bundled = {_artifact(jar.name) for jar in _pyspark_jars()}
        for jar in resolved:
            # Ivy names jars group_artifact-version.jar; pyspark's own are artifact-version.jar.
            if _artifact(jar.name.split("_", 1)[1]) not in bundled:
                shutil.copy2(jar, staging / jar.name)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return sorted(target.glob("*.jar"))


def _pyspark_jars() -> list[Path]:
    import pyspark

    return sorted(Path(pyspark.__file__).parent.joinpath("jars").glob("*.jar"))


def _artifact(file_name: str) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients``."""
    return re.sub(r"-\d[^-]*(-[A-Za-z0-9.]+)?\.jar$", "", file_name)


if __name__ == "__main__":
    for jar in resolve():
        print(jar)
