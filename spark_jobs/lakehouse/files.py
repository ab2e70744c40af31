"""Files of the lakehouse through Hadoop's FileSystem, as Spark reaches them: local
paths and object stores alike."""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession

from spark_jobs.jvm import java_class
from spark_jobs.tables import join


def hadoop_file(spark: SparkSession, path: str, *parts: str) -> tuple[Any, Any]:
    """(the Hadoop FileSystem, the Hadoop Path) of ``path`` joined with ``parts``:
    local folders and object stores alike, through the session's Hadoop settings."""
    hadoop_path = java_class(spark, "org.apache.hadoop.fs.Path")(join(path, *parts))
    return hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), hadoop_path


def read_text(spark: SparkSession, path: str, *parts: str) -> str:
    """A small file's text through Hadoop's FileSystem (``spark.read`` would be a job)."""
    filesystem, hadoop_path = hadoop_file(spark, path, *parts)
    stream = filesystem.open(hadoop_path)
    try:
        return java_class(spark, "org.apache.commons.io.IOUtils").toString(stream, "UTF-8")
    finally:
        stream.close()


def visible_files(spark: SparkSession, folder: str) -> dict[str, int]:
    """The files directly in ``folder`` whose names start with neither ``.`` nor ``_``
    (hidden while written, by the landing convention), with their modification times
    in ms; a folder that does not exist holds none."""
    filesystem, path = hadoop_file(spark, folder)
    if not filesystem.exists(path):
        return {}
    return {
        status.getPath().getName(): status.getModificationTime()
        for status in filesystem.listStatus(path)
        if status.isFile() and not status.getPath().getName().startswith((".", "_"))
    }


def subfolder_sizes(spark: SparkSession, folder: str) -> dict[str, int]:
    """The bytes under each folder directly in ``folder``, by name; a folder that does
    not exist holds none."""
    filesystem, path = hadoop_file(spark, folder)
    if not filesystem.exists(path):
        return {}
    return {
        status.getPath().getName(): filesystem.getContentSummary(status.getPath()).getLength()
        for status in filesystem.listStatus(path)
        if status.isDirectory()
    }


def delete_tree(spark: SparkSession, folder: str) -> None:
    """Delete ``folder`` and everything under it; one that does not exist is fine."""
    filesystem, path = hadoop_file(spark, folder)
    filesystem.delete(path, True)


def delete_older_than(spark: SparkSession, folder: str, moment_ms: int) -> int:
    """Delete every file under ``folder`` (at any depth) last modified before ``moment_ms``;
    returns how many. A folder that does not exist holds none."""
    filesystem, path = hadoop_file(spark, folder)
    if not filesystem.exists(path):
        return 0
    files = filesystem.listFiles(path, True)
    old = []
    while files.hasNext():
        status = files.next()
        if status.getModificationTime() < moment_ms:
            old.append(status.getPath())
    return sum(bool(filesystem.delete(file, False)) for file in old)
