"""Hadoop's local file system without its shell-outs.

Without Hadoop's native library, which pip's pyspark does not ship, Hadoop's local
file system starts a ``readlink`` for every link status (a rename asks for four:
source, destination and their checksum files) and a ``chmod`` for every file it
creates. Every Delta commit and every streaming checkpoint file on a local disk
started 5 processes. The classes in ``spark_jobs/java/io/tidemark/fs`` do both
through the JVM; they are compiled at setup into Tidemark's jar
(``spark_jobs.java_build``), and :data:`HADOOP_CONF` makes them the ``file:``
scheme's file systems, and :data:`LOG_STORE_CONF` makes Delta commit a version on
it once among any number of JVMs (a link, which fails where the name exists) and
list a log by names before statuses.
"""

from __future__ import annotations

HADOOP_CONF = {
    # The FileSystem API: Spark's and Parquet's reads and writes.
    "spark.hadoop.fs.file.impl": "io.tidemark.fs.PosixLocalFileSystem",
    # The FileContext API: Delta's commits and Spark's checkpoint files.
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "io.tidemark.fs.PosixLocalFs",
}

LOG_STORE_CONF = {
    # Delta's log store for file:: a version committed once across JVMs, a log listed
    # from a version without a status per entry.
    "spark.delta.logStore.file.impl": "io.tidemark.fs.LocalLogStore",
}
