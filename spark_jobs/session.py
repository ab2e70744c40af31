"""The one Spark session factory: every job and every test gets its session here.

:func:`spark_conf` is also what spark-submit commands pass as ``--conf``, so a
job started by Airflow or the CLI runs with exactly the settings of a test.

Jobs use path-based Delta tables and an in-memory catalog; the SQL server owns
the persistent catalog (Derby allows one process).

Where a job runs is its master's business. A local master gets small-machine
defaults. A cluster master (``spark://``, ``yarn``, ``k8s://``) gets settings for
Tidemark's small micro-batches (one trigger's slice of the input, small ops
tables) rather than Spark's 200 shuffle partitions and Delta's 50 snapshot
partitions: every partition is a task, and on a batch this size scheduling them
costs more than the work. Size shuffles to the cores an application gets (about
twice as many) with ``$TIDEMARK_SHUFFLE_PARTITIONS``; ``$TIDEMARK_DRIVER_MEMORY``
sizes the driver; ``TIDEMARK_SPARK_UI=true`` turns the Spark UI on (off by
default: its web server costs every start-up). ``$TIDEMARK_JVM_PROFILE`` picks the
JVMs' compilers and collector and whether Spark compiles expressions
(:data:`JVM_PROFILES`). Nothing here assumes the driver's disk is the
executors': the jars in ``spark.jars`` are served to
executors by the driver, and ``$TIDEMARK_S3_ENDPOINT`` points s3a:// lakehouse paths at object storage
(credentials from the AWS_* environment of the driver and the workers).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import SparkSession

from spark_jobs.jars import local_jars
from spark_jobs.jvm_archive import driver_java_options
from spark_jobs.posix_fs import HADOOP_CONF

DEFAULT_MASTER = "local[*]"
LOG4J = Path(__file__).with_name("log4j2.properties")
JVM_PROFILE_VARIABLE = "TIDEMARK_JVM_PROFILE"
SHUFFLE_PARTITIONS_VARIABLE = "TIDEMARK_SHUFFLE_PARTITIONS"
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
DEFAULT_PARALLELISM = "spark.default.parallelism"
# Spark generates the Java source of every task's projections, and compiles it for
# every distinct plan. On micro-batches of a few records, and on the Delta log reads
# behind every idempotent write, that is a third of the JVM's samples. Interpreted,
# the 24-record replay below takes 60 CPU-seconds in 45 s instead of 77 in 57 (under
# short-jobs). Per row they cost more: 300 k events through bronze take 11.2 s
# instead of 7.7. Whole-stage code generation is off as well: a query with a new
# literal, which compiles 2 classes under the default mode, compiles none.
CODEGEN_CACHE_ENTRIES = "spark.sql.codegen.cache.maxEntries"
PARQUET_TIMESTAMPS = "spark.sql.parquet.outputTimestampType"
CODEGEN_FACTORY_MODE = "spark.sql.codegen.factoryMode"
# Adaptive execution re-plans a query after each of its shuffle stages, each stage a
# Spark job of its own: on batches of a few hundred records it saves nothing and
# costs its jobs and re-optimisations. A replay of 3.2 k records in 7 micro-batches on
# a warm session (as the test suite runs them): 13.8 s without it, 15.1 with it (means
# of 6); a new process's 24-record replay did not move (20-24 s either way).
ADAPTIVE_EXECUTION = "spark.sql.adaptive.enabled"
SMALL_BATCHES = {CODEGEN_FACTORY_MODE: "NO_CODEGEN", ADAPTIVE_EXECUTION: "false"}
# With it on (PySpark's default), every function that builds a Column walks the Python
# stack for its call site and sends it to the JVM around the call (about seven more
# py4j round trips each), so that an error in the expression names the Python line.
# Tidemark's expressions are its own, built per micro-batch: the 24-record replay
# makes 21 k py4j calls with it and 10.7 k without, and takes 12.6-12.9 s against
# 11.7-12.1 (a new process each, 3 alternated runs).
DATAFRAME_DEBUGGING = "spark.python.sql.dataFrameDebugging.enabled"


@dataclass(frozen=True)
class JvmProfile:
    """How a job's JVMs trade start-up CPU for speed on large batches:
    ``java_options`` for any JVM of the profile (beeline's and the Kafka broker's too,
    which choose their own collector), ``heap_options`` and ``collector`` for Spark's
    drivers and executors, whose maximum heap Spark always sets."""

    java_options: str = ""
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    heap_options: str = ""
    collector: str = ""


# Measured on 2 cores:
# - throughput: the JDK's defaults (C1 then C2, G1) and Spark's expression code
#   generation. The C2 compiler threads and G1's concurrent threads burn as much CPU
#   as the job itself in the first minute: a 24-record replay takes 97 CPU-seconds in 52 s.
# - short-jobs: C1 only, one compiler thread, the parallel collector (no concurrent
#   threads, like the serial one, but its pauses use both cores: a 24-record replay's
#   five young collections took 288 ms against 430-460 serial, and the replay 9.83 ->
#   9.65 s, medians of 5 alternated), interpreted expressions, no adaptive execution.
#   The same replay took 60 CPU-seconds in 45 s (serial collector then); but 300 k
#   events through silver take 19 s, not 12. For jobs of seconds and tiny batches on a small
#   machine (the test suite). C1 alone also shrinks the code cache to 48 MB, which
#   Spark and Delta fill within minutes; then the sweeper evicts and C1 compiles again:
#   two integration test files on one C1-only session took 327 CPU-s (the sweeper 73),
#   with the tiered size 210. Its heap starts at the maximum spark.driver.memory
#   gives (HotSpot clamps InitialRAMPercentage to -Xmx): grown from a small start, the
#   serial collector ran hundreds of young and a few full collections in a job's first
#   minute. The 24-record replay below, alternated, took 29.5, 29.8, 32.7 and 27.1 s
#   without, 27.5, 24.0, 32.1 and 23.8 with (the tiny bench's machine CPU 203, 200, 237
#   and 194 against 192, 175, 233 and 175).
DEFAULT_PROFILE = "throughput"
# C1 compiles a method after 30 calls instead of the JDK's 200 (its thresholds of calls
# plus loop iterations and of loop iterations alone at a seventh and a tenth as well): a
# short job's driver runs most of its code a few hundred times, then never again, so
# it otherwise interprets the code it spends its life in. The 24-record replay in a new
# process, 6 runs each alternated: median 11.0 s at the JDK's thresholds, 10.6 at these.
C1_EARLY = (
    "-XX:Tier3InvocationThreshold=30 -XX:Tier3MinInvocationThreshold=15 "
    "-XX:Tier3CompileThreshold=300 -XX:Tier3BackEdgeThreshold=6000"
)
# Spark's drivers load some 150 MB of class metadata. The collector runs a full
# collection the first time metaspace passes its initial 21 MB threshold, to unload
# classes a driver never unloads: 154 ms of a 24-record replay's 10.6 s (serial), gone
# at 256 MB (its 4-5 young collections stay; a young generation twice as large saved nothing).
CLASS_METADATA_ROOM = "-XX:MetaspaceSize=256m"
# One-query and broker JVMs (beeline, Kafka) and the tests' long session collect serially.
SERIAL_COLLECTOR = "-XX:+UseSerialGC"
JVM_PROFILES = {
    DEFAULT_PROFILE: JvmProfile(),
    "short-jobs": JvmProfile(
        f"-XX:TieredStopAtLevel=1 -XX:CICompilerCount=1 -XX:ReservedCodeCacheSize=240m {C1_EARLY}",
        SMALL_BATCHES,
        f"-XX:InitialRAMPercentage=100 {CLASS_METADATA_ROOM}",
        "-XX:+UseParallelGC",
    ),
}

# A replay knows its input before its JVM starts. On a small one, start-up and
# first-time planning are most of what it costs and short-jobs saves a third; on a
# large one, generated code and C2 pay back. Replays with --flush on 2 cores,
# seconds under throughput / short-jobs: 24 records in 4 batches 47.4 / 33.8
# (medians of 3); 8.6 k in 2 batches 49.1 / 32.1 and 26.5 k in 4 batches 45.8 /
# 36.7 (means of 2); 96 k in 96 batches 194 / 169; 279 k in 28 batches 95 / 154.
SHORT_JOB_RECORDS = 30_000


def profile_for_records(records: int) -> str:
    """The JVM profile for a job over ``records`` input records known up front."""
    return "short-jobs" if records <= SHORT_JOB_RECORDS else DEFAULT_PROFILE


# On an input this small a task costs more to schedule than its share of the work:
# one shuffle partition and one slice of local rows instead of four. Replays with
# --flush in a new process on 2 cores, seconds with four / one (alternated): 24
# records in 4 batches 11.9, 11.7, 11.6 / 11.1, 10.7, 10.9; 9.6 k in 4 batches
# 14.1, 13.2 / 13.1, 13.1; 23 k in 4 batches 14.8, 16.0 / 15.4, 15.3 (even).
ONE_PARTITION_RECORDS = 10_000


def conf_for_records(records: int) -> dict[str, str]:
    """Partitioning for a job over ``records`` input records known up front: one
    partition up to :data:`ONE_PARTITION_RECORDS`, unless ``$TIDEMARK_SHUFFLE_PARTITIONS``
    chose."""
    if records > ONE_PARTITION_RECORDS or os.environ.get(SHUFFLE_PARTITIONS_VARIABLE):
        return {}
    return {SHUFFLE_PARTITIONS: "1", DEFAULT_PARALLELISM: "1"}


def session_for_records(app_name: str, records: int) -> SparkSession:
    """The session of a job over ``records`` input records known up front (a replay,
    a tuning run over a file): its JVM profile and partitioning sized to them."""
    return build_session(
        app_name, overrides=conf_for_records(records), default_profile=profile_for_records(records)
    )


# A continuous stream's micro-batch holds what arrived in one interval: small batches,
# for hours. On one small machine Under throughput the C2 compiler threads take the cores from the first
# batches for a minute. Bronze and silver as continuous spark-submits, 1 s triggers,
# 100 records/s for 90 s on 2 cores, firing latency median / p95: throughput 4.51 /
# 10.66 s, short-jobs 2.54 / 3.25; the four streams as one application fed 2,000
# records/s for 60 s carried 1,334 records/s under throughput, 1,556 under short-jobs.
CONTINUOUS_PROFILE = "short-jobs"


def profile_for_trigger(trigger: str | None, local: bool) -> str:
    """The JVM profile for a job under ``trigger`` (None: a job that is no stream) on
    a ``local`` master or a cluster. An available-now run drains a backlog of any size,
    and a cluster's executors have cores to spare for C2: the default."""
    return CONTINUOUS_PROFILE if trigger == "continuous" and local else DEFAULT_PROFILE


def is_local_master(master: str) -> bool:
    """``local``, ``local[N]``, ``local[*]``, ``local-cluster[...]``: one machine, one disk."""
    return master.startswith("local")


def jvm_profile(default: str = DEFAULT_PROFILE, chosen: str | None = None) -> JvmProfile:
    """The profile ``chosen`` for one job, else the one ``$TIDEMARK_JVM_PROFILE`` names,
    else ``default``."""
    profile = chosen or os.environ.get(JVM_PROFILE_VARIABLE) or default
    if profile not in JVM_PROFILES:
        source = "the job's profile" if chosen else JVM_PROFILE_VARIABLE
        raise ValueError(f"{source}={profile!r}: expected one of {', '.join(JVM_PROFILES)}")
    return JVM_PROFILES[profile]


def base_conf(default_profile: str = DEFAULT_PROFILE, chosen_profile: str | None = None) -> dict[str, str]:
    """What every session needs wherever it runs: Delta, the jars, UTC everywhere,
    and the JVM profile (``chosen_profile``, else ``$TIDEMARK_JVM_PROFILE``, else
    ``default_profile``)."""
    profile = jvm_profile(default_profile, chosen_profile)
    conf = {
        **profile.spark_conf,
        "spark.jars": ",".join(local_jars()),
        # The driver loads them through its own class path as well: the JVM's class
        # archive (spark_jobs.jvm_archive) holds only classes of that path, and Delta's
        # are most of what a job loads after Spark's. Executors get them from spark.jars.
        "spark.driver.extraClassPath": os.pathsep.join(local_jars()),
        # file: through the JVM, not through readlink and chmod processes.
        **HADOOP_CONF,
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.catalogImplementation": "in-memory",
        "spark.sql.session.timeZone": "UTC",
        # Parquet's 64-bit microseconds, not Spark's default INT96 (which Parquet has
        # deprecated): a timestamp column's dictionary holds longs, not 12-byte arrays
        # hashed and compared a value at a time. Bronze at 1 M events, 3 timestamp
        # columns: 3.60 s -> 3.18 and 3.25 (the idiomatic stream 2.43 -> 2.17 and 2.27).
        PARQUET_TIMESTAMPS: "TIMESTAMP_MICROS",
        DATAFRAME_DEBUGGING: "false",
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        "spark.ui.showConsoleProgress": "false",
        # Generated classes are cached by their code, 100 by default: a process that
        # runs a few streams and Delta's log reads compiles more distinct classes than
        # that, and then compiles the same code again every micro-batch. Measured
        # warm on 2 cores, bronze and silver of 100 records a batch: 34 compiles a
        # batch at 100 entries, 4 at 2000; silver's batch 3.3 s and 1.9 s (medians of 6).
        CODEGEN_CACHE_ENTRIES: "2000",
        # Starting the UI's web server costs every job start-up; turn it on to watch one.
        "spark.ui.enabled": "true" if os.environ.get("TIDEMARK_SPARK_UI") == "true" else "false",
    }
    endpoint = os.environ.get("TIDEMARK_S3_ENDPOINT")
    if endpoint:
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
        conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
    # Imported from a zip shipped with --py-files (a driver on a cluster), the package
    # has no log4j file on disk: then spark-submit's own Java options stand.
    if LOG4J.is_file():
        logging = f"-Dlog4j2.configurationFile={LOG4J}"
        java_options = " ".join(
            filter(
                None,
                [
                    "-Duser.timezone=UTC",
                    logging,
                    profile.java_options,
                    profile.collector,
                    profile.heap_options,
                ],
            )
        )
        conf["spark.driver.extraJavaOptions"] = f"{java_options} {driver_java_options()}".rstrip()
        conf["spark.executor.extraJavaOptions"] = java_options
    return conf


def profile_conf(local: bool) -> dict[str, str]:
    """Small-machine defaults for a local master, small-batch ones for a cluster."""
    shuffle = os.environ.get(SHUFFLE_PARTITIONS_VARIABLE)
    driver_memory = os.environ.get("TIDEMARK_DRIVER_MEMORY")
    if local:
        return {
            SHUFFLE_PARTITIONS: shuffle or "4",
            DEFAULT_PARALLELISM: "4",
            "spark.databricks.delta.snapshotPartitions": "2",
            "spark.driver.memory": driver_memory or "2g",
        }
    conf = {
        SHUFFLE_PARTITIONS: shuffle or "8",
        "spark.databricks.delta.snapshotPartitions": "8",
    }
    if driver_memory:
        conf["spark.driver.memory"] = driver_memory
    return conf


def spark_conf(
    local: bool = True,
    overrides: Mapping[str, str] | None = None,
    default_profile: str = DEFAULT_PROFILE,
    chosen_profile: str | None = None,
) -> dict[str, str]:
    """Delta, the local jars, UTC everywhere, and small-machine defaults when ``local``."""
    return {**base_conf(default_profile, chosen_profile), **profile_conf(local), **(overrides or {})}


def session_master(master: str | None = None) -> str | None:
    """The master a session in this process runs on: ``master``, else
    ``$TIDEMARK_SPARK_MASTER``, else local; None under spark-submit, whose command
    line chose."""
    chosen = master or os.environ.get("TIDEMARK_SPARK_MASTER")
    if chosen is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        return DEFAULT_MASTER
    return chosen


def build_session(
    app_name: str,
    master: str | None = None,
    overrides: Mapping[str, str] | None = None,
    default_profile: str = DEFAULT_PROFILE,
) -> SparkSession:
    """Return the Delta-enabled session for ``app_name``.

    The master is ``master``, else ``$TIDEMARK_SPARK_MASTER``, else local. The JVM
    starts under ``$TIDEMARK_JVM_PROFILE``, else ``default_profile`` (a job that
    knows its input is small asks for ``short-jobs``: :func:`profile_for_records`).
    Under spark-submit the master chosen on its command line is kept, and so are
    the profile settings that came with it (only :func:`base_conf` is repeated).
    """
    chosen = session_master(master)
    builder = SparkSession.builder.appName(app_name)
    if chosen is None:
        settings = {**base_conf(), **(overrides or {})}
    else:
        builder = builder.master(chosen)
        settings = spark_conf(is_local_master(chosen), overrides, default_profile)
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
