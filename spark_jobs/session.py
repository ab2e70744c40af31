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
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import SparkSession

from spark_jobs import object_store
from spark_jobs.jars import local_jars
from spark_jobs.jvm import driver_java_options
from spark_jobs.posix_fs import HADOOP_CONF, LOG_STORE_CONF

DEFAULT_MASTER = "local[*]"
LOG4J = Path(__file__).with_name("log4j2.properties")
JVM_PROFILE_VARIABLE = "TIDEMARK_JVM_PROFILE"
SHUFFLE_PARTITIONS_VARIABLE = "TIDEMARK_SHUFFLE_PARTITIONS"
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
DEFAULT_PARALLELISM = "spark.default.parallelism"
# Spark generates the Java source of every task's projections, and compiles it for
# every distinct plan. On micro-batches of a few records, and on the Delta log reads
# behind every idempotent write, that compiling is much of the JVM's work; interpreted
# expressions cost more per row, so only small batches go without it. Whole-stage code
# generation is off as well, so a query with a new literal compiles nothing.
CODEGEN_CACHE_ENTRIES = "spark.sql.codegen.cache.maxEntries"
PARQUET_TIMESTAMPS = "spark.sql.parquet.outputTimestampType"
CODEGEN_FACTORY_MODE = "spark.sql.codegen.factoryMode"
# Adaptive execution re-plans a query after each of its shuffle stages, each stage a
# Spark job of its own: on batches of a few hundred records it saves nothing and
# costs its jobs and re-optimisations.
ADAPTIVE_EXECUTION = "spark.sql.adaptive.enabled"
SMALL_BATCHES = {CODEGEN_FACTORY_MODE: "NO_CODEGEN", ADAPTIVE_EXECUTION: "false"}
# With it on (PySpark's default), every function that builds a Column walks the Python
# stack for its call site and sends it to the JVM around the call (several more py4j
# round trips each), so that an error in the expression names the Python line.
# Tidemark's expressions are its own, built per micro-batch: every batch would pay
# those round trips for call sites that name no user's code.
DATAFRAME_DEBUGGING = "spark.python.sql.dataFrameDebugging.enabled"
VACUUM_RETAIN_IGNORED = "spark.databricks.delta.vacuum.retentionWindowIgnore.enabled"


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


# The profiles:
# - throughput: the JDK's defaults (C1 then C2, G1) and Spark's expression code
#   generation. On a small machine the C2 compiler threads and G1's concurrent threads
#   cost a short job more CPU than its own work.
# - short-jobs: C1 only, one compiler thread, the parallel collector (no concurrent
#   threads, like the serial one, but its pauses use every core), interpreted
#   expressions, no adaptive execution. For jobs of seconds and tiny batches on a small
#   machine (the test suite); large batches run slower under it. C1 alone also shrinks
#   the code cache to 48 MB, which Spark and Delta fill within minutes; then the sweeper
#   evicts and C1 compiles again, so the profile keeps the tiered size. Its heap starts
#   at the maximum spark.driver.memory gives (HotSpot clamps InitialRAMPercentage to
#   -Xmx): grown from a small start, the collector runs again and again in a job's
#   first minute.
DEFAULT_PROFILE = "throughput"
# C1 compiles a method after 30 calls instead of the JDK's 200 (its thresholds of calls
# plus loop iterations and of loop iterations alone at a seventh and a tenth as well): a
# short job's driver runs most of its code a few hundred times, then never again, so
# it otherwise interprets the code it spends its life in.
C1_EARLY = (
    "-XX:Tier3InvocationThreshold=30 -XX:Tier3MinInvocationThreshold=15 "
    "-XX:Tier3CompileThreshold=300 -XX:Tier3BackEdgeThreshold=6000"
)
# Spark's drivers load far more class metadata than metaspace's initial 21 MB threshold,
# and the first time metaspace passes it the collector runs a full collection, to unload
# classes a driver never unloads: a pause for nothing, which starting at 256 MB avoids.
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
# first-time planning are most of what it costs, which short-jobs cuts; on a large
# one, generated code and C2 pay back.
SHORT_JOB_RECORDS = 30_000


def profile_for_records(records: int) -> str:
    """The JVM profile for a job over ``records`` input records known up front."""
    return "short-jobs" if records <= SHORT_JOB_RECORDS else DEFAULT_PROFILE


# On an input this small a task costs more to schedule than its share of the work:
# one shuffle partition and one slice of local rows instead of four. Beyond it the
# saving is gone.
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
# for hours. On a small machine under throughput the C2 compiler threads take the cores
# from the first batches, so windows fire later and fewer records a second keep up.
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
        **LOG_STORE_CONF,
        # s3a:: the object store's log store, and its endpoint from the environment.
        **object_store.spark_conf(),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.catalogImplementation": "in-memory",
        "spark.sql.session.timeZone": "UTC",
        # Delta 4 ignores VACUUM's RETAIN (unless 0 hours) for the table's removed-file
        # retention, an hour on Tidemark's tables: a VACUUM, the maintenance job's or a
        # query's, would delete files a week younger than its RETAIN said to keep.
        VACUUM_RETAIN_IGNORED: "false",
        # Parquet's 64-bit microseconds, not Spark's default INT96 (which Parquet has
        # deprecated): a timestamp column's dictionary holds longs, not 12-byte arrays
        # hashed and compared a value at a time.
        PARQUET_TIMESTAMPS: "TIMESTAMP_MICROS",
        DATAFRAME_DEBUGGING: "false",
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        "spark.ui.showConsoleProgress": "false",
        # Generated classes are cached by their code, 100 by default: a process that
        # runs a few streams and Delta's log reads compiles more distinct classes than
        # that, and then compiles the same code again every micro-batch.
        CODEGEN_CACHE_ENTRIES: "2000",
        # What the status store keeps of finished work, UI or not: a pipeline of 1-second
        # batches runs thousands of jobs an hour, and the store's upkeep (a trim sorts
        # it whenever it passes its limit) grows with its size; minutes' worth is kept.
        "spark.ui.retainedJobs": "200",
        "spark.ui.retainedStages": "200",
        "spark.ui.retainedTasks": "2000",
        "spark.sql.ui.retainedExecutions": "100",
        # Starting the UI's web server costs every job start-up; turn it on to watch one.
        "spark.ui.enabled": "true" if os.environ.get("TIDEMARK_SPARK_UI") == "true" else "false",
    }
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
        local = is_local_master(chosen)
        settings = spark_conf(local, overrides, default_profile)
        if local:
            # Its Python workers run this interpreter and its packages (the session
            # windows' judging needs pandas), not the first python3 on the PATH: PySpark
            # takes the workers' Python from the environment only (spark-submit sets it).
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
