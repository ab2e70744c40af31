"""The driver's JVM: handles on its Java classes, and the class-data-sharing archive
its options name (made by :mod:`spark_jobs.jvm_archive`)."""

from __future__ import annotations

import os
from pathlib import Path

from py4j.java_gateway import JavaClass
from pyspark.sql import SparkSession

from spark_jobs.jars import jars_dir


def java_class(spark: SparkSession, name: str) -> JavaClass:
    """The Java class ``name`` (its binary name: ``Outer$Inner`` for a nested class).

    A dotted path through ``spark._jvm`` asks the JVM about every package on the way,
    and each is a class lookup that fails through every jar on the class path; a class
    made from its name is one lookup."""
    return JavaClass(name, spark._jvm._gateway_client)


# Set by the training run: the driver then writes its loaded classes to this path.
DUMP_VARIABLE = "TIDEMARK_JVM_ARCHIVE_DUMP"


# A missing, stale or foreign archive must cost nothing, not even a warning per job.
QUIET = "-Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"


def archive_path() -> Path:
    """Beside the jars: ``<jars_dir>/../jvm/spark-classes.jsa``."""
    return jars_dir().parent / "jvm" / "spark-classes.jsa"


def driver_java_options() -> str:
    """The driver's JVM options for the archive: write it (training run), use it
    (it exists), or nothing."""
    dump = os.environ.get(DUMP_VARIABLE)
    if dump:
        return f"-XX:ArchiveClassesAtExit={dump} {QUIET}"
    archive = archive_path()
    return f"-XX:SharedArchiveFile={archive} {QUIET}" if archive.is_file() else ""


def error_summary(error: BaseException) -> str:
    """One line for ``error``: the Java exception behind a Py4J error (its own first line
    says only which call failed), else the error's first line."""
    java = getattr(error, "java_exception", None)
    text = str(java.toString()) if java is not None else str(error).strip()
    return (text.splitlines() or [type(error).__name__])[0][:500]
