"""The one Spark session factory: every job and every test gets its session here.

:func:`spark_conf` is also what spark-submit commands pass as ``--conf``, so a
job started by Airflow or the CLI runs with exactly the settings of a test.

Jobs use path-based Delta tables and an in-memory catalog; the SQL server owns
the persistent catalog (Derby allows one process).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from spark_jobs.jars import local_jars

DEFAULT_MASTER = "local[*]"


def spark_conf(local: bool = True, overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """Delta, the local jars, UTC everywhere, and small-machine defaults when ``local``."""
    log4j = Path(__file__).with_name("log4j2.properties")
    java_options = f"-Duser.timezone=UTC -Dlog4j2.configurationFile={log4j}"
    conf = {
        "spark.jars": ",".join(local_jars()),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.catalogImplementation": "in-memory",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": java_options,
        "spark.executor.extraJavaOptions": java_options,
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        "spark.ui.showConsoleProgress": "false",
    }
    if local:
        conf.update(
            {
                "spark.sql.shuffle.partitions": os.environ.get("TIDEMARK_SHUFFLE_PARTITIONS", "4"),
                "spark.default.parallelism": "4",
                "spark.databricks.delta.snapshotPartitions": "2",
                "spark.driver.memory": os.environ.get("TIDEMARK_DRIVER_MEMORY", "2g"),
            }
        )
    conf.update(overrides or {})
    return conf


def build_session(
    app_name: str,
    master: str | None = None,
    overrides: Mapping[str, str] | None = None,
) -> SparkSession:
    """Return the Delta-enabled session for ``app_name``.

    The master is ``master``, else ``$TIDEMARK_SPARK_MASTER``, else local.
    Under spark-submit the master chosen on its command line is kept.
    """
    under_spark_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    chosen = master or os.environ.get("TIDEMARK_SPARK_MASTER")
    if chosen is None and not under_spark_submit:
        chosen = DEFAULT_MASTER
    builder = SparkSession.builder.appName(app_name)
    if chosen is not None:
        builder = builder.master(chosen)
    is_local = (chosen or "").startswith("local")
    for key, value in spark_conf(local=is_local, overrides=overrides).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
