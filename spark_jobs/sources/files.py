"""The file landing zone: JSON-lines or CSV files, picked up as they land.

Each file is read whole (``wholetext``) and split into lines in Spark, so that
every record keeps a deterministic coordinate: its file and 1-based line
number (``source_offset``). ``ingest_time`` is the file's arrival (modification)
time. Files named with a leading ``.`` or ``_`` are ignored by Spark, so
writers land a file under a hidden name and rename it when complete. A CSV
file's first line is its header. Landing files should stay well below the
memory of one task (tens of MB).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.config import PipelineConfig
from spark_jobs.tables import hadoop_file


def ensure_folder(spark: SparkSession, path: str) -> None:
    """Create ``path`` on whatever filesystem it names (the file source needs it to exist)."""
    filesystem, hadoop_path = hadoop_file(spark, path)
    filesystem.mkdirs(hadoop_path)


def split_lines(files: DataFrame, has_header: bool) -> DataFrame:
    """One row per record: ``raw``, its 1-based ``source_offset`` and the file's ``header``.

    A trailing newline does not make an extra (empty) record; other blank lines
    do, and are rejected as empty records downstream."""
    # Split once per file and keep only small columns beside the exploded lines:
    # anything that refers to the whole file after the explode is paid per line.
    arrays = files.select(
        F.split(F.col("value"), "\n", -1).alias("lines"), "source_file", "ingest_time"
    ).select(
        "lines",
        F.size("lines").alias("line_count"),
        F.col("lines").getItem(0).alias("header"),
        "source_file",
        "ingest_time",
    )
    exploded = arrays.select(
        F.posexplode("lines").alias("pos", "line"), "line_count", "header", "source_file", "ingest_time"
    )
    trailing = (F.col("pos") == F.col("line_count") - 1) & (F.col("line") == "")
    kept = exploded.where(~trailing & (F.col("pos") > 0 if has_header else F.lit(True)))
    header = without_carriage_return(F.col("header")) if has_header else F.lit(None).cast("string")
    return kept.select(
        without_carriage_return(F.col("line")).alias("raw"),
        F.lit(None).cast("string").alias("source_partition"),
        "source_file",
        (F.col("pos") + 1).cast("long").alias("source_offset"),
        "ingest_time",
        header.alias("header"),
    )


def without_carriage_return(line: Column) -> Column:
    """A CRLF file's line without its ``\\r`` (a plain test, not a regex per line)."""
    return F.when(line.endswith("\r"), line.substr(F.lit(1), F.length(line) - 1)).otherwise(line)


def read_landing(spark: SparkSession, config: PipelineConfig, landing_path: str) -> DataFrame:
    ensure_folder(spark, landing_path)
    reader = spark.readStream.format("text").option("wholetext", "true")
    if config.source.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", config.source.max_files_per_trigger)
    files = reader.load(landing_path).select(
        "value",
        F.col("_metadata.file_path").alias("source_file"),
        F.col("_metadata.file_modification_time").alias("ingest_time"),
    )
    return split_lines(files, has_header=config.source.format == "csv")
