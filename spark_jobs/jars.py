"""Maven jars resolved once at setup into local folders, so nothing fetches at run time.

``python -m spark_jobs.jars`` (run by ``make setup``) fetches:

- Delta and the Kafka connector into :func:`jars_dir`, and S3A into :func:`s3a_dir`,
  pinned jar by jar with their SHA-256 (:data:`SPARK_JARS`, :data:`S3A_JARS`); the
  session factory and every spark-submit command point ``spark.jars`` at those files,
  and at the one Tidemark compiles itself (:func:`tidemark_jar_dir`,
  ``spark_jobs.java_build``);
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


# S3A, Hadoop's s3a:// file system, for a lakehouse on object storage: hadoop-aws of
# pyspark's Hadoop and the modules of the AWS SDK v2 it calls, not the SDK's 600 MB
# bundle. The set is what an s3a:// lakehouse, its commits and their conditional
# creates load, found by running them.
S3A_JARS = (
    PinnedJar(
        "org.apache.hadoop:hadoop-aws:3.5.0",
        "66bd9eefb938b1a1657487324b63c13df2d8b17164a1dd24e0ef37b905bc5baa",
    ),
    PinnedJar(
        "org.reactivestreams:reactive-streams:1.0.4",
        "f75ca597789b3dac58f61857b9ac2e1034a68fa672db35055a8fb4509e325f28",
    ),
    PinnedJar(
        "software.amazon.awssdk:annotations:2.35.4",
        "6f36bd87155d1dd85d6efbdd29e532e3759a022211feb71affebee1aa34f04b8",
    ),
    PinnedJar(
        "software.amazon.awssdk:apache-client:2.35.4",
        "6eade21b482724ed0a4613eaa95d20e47e7a81304bd28538ac427fece94a7740",
    ),
    PinnedJar(
        "software.amazon.awssdk:arns:2.35.4",
        "c63cc29f76a8527e9e10b621703163df541dc5cb315508dc2898518602c75380",
    ),
    PinnedJar(
        "software.amazon.awssdk:auth:2.35.4",
        "6b601323004833fb4a857ffc95db4795e0e6320eb93e64b1246c655c9ff04994",
    ),
    PinnedJar(
        "software.amazon.awssdk:aws-core:2.35.4",
        "fdb5fc8f1a48d97fa7d04d3460fb42f6973c7b1bbe1b9d317871ef0162bcb623",
    ),
    PinnedJar(
        "software.amazon.awssdk:aws-query-protocol:2.35.4",
        "9b4cf9b78977cc9f5b4ceae9c435dedbde6a055a0f8d9e053eaca945715e2a9f",
    ),
    PinnedJar(
        "software.amazon.awssdk:aws-xml-protocol:2.35.4",
        "4f59176da2522c357b1993e4a890fde529f12f365795ef86269bde4a3984cd0d",
    ),
    PinnedJar(
        "software.amazon.awssdk:checksums:2.35.4",
        "94464af4374d08ecf33ca06ed4d03e1615529e547726e26b56abacefbeee7948",
    ),
    PinnedJar(
        "software.amazon.awssdk:checksums-spi:2.35.4",
        "88b5af85ac2d3c862be8856be4e683ab31932e4a5a3c1c45af864d2671ac7cec",
    ),
    PinnedJar(
        "software.amazon.awssdk:endpoints-spi:2.35.4",
        "ef02441bda916959b8341290b49c68cc35538e1ad6f8629b75d8334dc6653e00",
    ),
    PinnedJar(
        "software.amazon.awssdk:http-auth:2.35.4",
        "3ec933a06e751a05e195eb3589209e23c44e1897263b6fcae34ef4cc63cd4491",
    ),
    PinnedJar(
        "software.amazon.awssdk:http-auth-aws:2.35.4",
        "c4acb92fdec90bfd9b67bfab8e41b69cd152c03cacc10281a8ab464791856e01",
    ),
    PinnedJar(
        "software.amazon.awssdk:http-auth-spi:2.35.4",
        "4495463406bb98eb136f2c3f3604ed5f08ec9974ebc3f34f2121b20679f61d5c",
    ),
    PinnedJar(
        "software.amazon.awssdk:http-client-spi:2.35.4",
        "728be89b2a07b595edb0adee3a2cbbbdd4cb1f4caddde0d08c3979fe2620dedb",
    ),
    PinnedJar(
        "software.amazon.awssdk:identity-spi:2.35.4",
        "188d73db7d4e2361654bc3c5a1b3eaeb445d0500fb012cc46c5d67975adf97bf",
    ),
    PinnedJar(
        "software.amazon.awssdk:json-utils:2.35.4",
        "80d67a6bb3e7eb49c7d4b6e4ba4c1463ed7da0192b795158328602dc131c5ecc",
    ),
    PinnedJar(
        "software.amazon.awssdk:metrics-spi:2.35.4",
        "c2a4ee90a21081317e2e6eba0c414d05d3d518aed2f86b1c1710a7367b450487",
    ),
    PinnedJar(
        "software.amazon.awssdk:profiles:2.35.4",
        "0f4ef7ca72ccd80dd49ebeaf7f3ce60a7d7a00da59a91aeeae6e91052bbacbd8",
    ),
    PinnedJar(
        "software.amazon.awssdk:protocol-core:2.35.4",
        "f2532eca6ba2142fe4821d5decb03c83a3e15dc8bfae2240e7f2efa75f9868b5",
    ),
    PinnedJar(
        "software.amazon.awssdk:regions:2.35.4",
        "77eae87b34ce96ecdf916a9bc06684dbeafcb6d38ef0513285fa5d5d6d41f5ca",
    ),
    PinnedJar(
        "software.amazon.awssdk:retries:2.35.4",
        "f99fb2f8c66d7e859955b3542d3af8f9de8f23a21d5e3250f0f2c5f18487e469",
    ),
    PinnedJar(
        "software.amazon.awssdk:retries-spi:2.35.4",
        "668638751d059c527ddd41ffa4dcebe36a7c14860ed56776df09b861c14dc7dd",
    ),
    PinnedJar(
        "software.amazon.awssdk:s3:2.35.4",
        "f23532c5223be9b0bfec0d72837ed09ed34dbdf8022818ba145b20076a78b4bc",
    ),
    PinnedJar(
        "software.amazon.awssdk:s3-transfer-manager:2.35.4",
        "0eec78870b3d0abc509a847072cf963cb2ae6e360dc6161a9449b3398c470476",
    ),
    PinnedJar(
        "software.amazon.awssdk:sdk-core:2.35.4",
        "fa559a4ce598852f3519c8f3b36250f583b0858a7611eedc4a81997778c617f4",
    ),
    PinnedJar(
        "software.amazon.awssdk:third-party-jackson-core:2.35.4",
        "32f4252c6c2df8f3a4aff885e6dc77024ad6b4cb48455d07b461ec30c41643ea",
    ),
    PinnedJar(
        "software.amazon.awssdk:utils:2.35.4",
        "642aeef536a071668f0b772f05f9d21573abf6955e7b6fb5fdb893760cca10e8",
    ),
    PinnedJar(
        "software.amazon.awssdk:utils-lite:2.35.4",
        "e004806def5e22ec98edc48a133ff3317166255e1ba29d93d129e9fdfa64a7be",
    ),
    PinnedJar(
        "software.amazon.s3.analyticsaccelerator:analyticsaccelerator-s3:1.3.1",
        "4959a9747cbb479c73c3ffbcd479bee5b014f8b2880994585a8693fb9d24675e",
    ),
)


def jars_dir() -> Path:
    """``$TIDEMARK_JARS_DIR``, else a folder inside the active virtualenv, so the
    jars belong to the environment that pins pyspark and delta-spark."""
    configured = os.environ.get("TIDEMARK_JARS_DIR")
    return Path(configured) if configured else Path(sys.prefix) / "share" / "tidemark" / "jars"


def token_provider_dir() -> Path:
    return jars_dir().with_name("token-provider")


def s3a_dir() -> Path:
    return jars_dir().with_name("s3a")


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
    for folder in (jars_dir(), token_provider_dir(), s3a_dir(), tidemark_jar_dir()):
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


TARGETS = ("spark", "token-provider", "s3a", "kafka")
# How main() runs one target in the process it starts for it.
IN_PROCESS = "--in-process"


def resolve_one(which: str) -> list[Path]:
    if which == "spark":
        return fetch(SPARK_JARS, jars_dir())
    if which == "token-provider":
        return fetch(TOKEN_PROVIDER_JARS, token_provider_dir())
    if which == "s3a":
        return fetch(S3A_JARS, s3a_dir())
    return resolve([KAFKA_BROKER.format(scala=SCALA_VERSION)], kafka_jars_dir())


def _pyspark_jars() -> list[Path]:
    import pyspark

    return sorted(Path(pyspark.__file__).parent.joinpath("jars").glob("*.jar"))


def main(argv: list[str]) -> None:
    """Fetch the named targets (``spark``, ``token-provider``, ``s3a``, ``kafka``; none: all),
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
