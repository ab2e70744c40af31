"""The file landing zone: JSON-lines or CSV files, picked up as they land.

Every record keeps a deterministic coordinate: its file and 1-based line number
(``source_offset``), lines split at ``\\n`` (a trailing ``\\r`` dropped, a final
newline adding no record). A UTF-8 byte-order mark that begins a file is an
encoding mark, not part of its first line. ``ingest_time`` is the file's arrival
(modification) time. Files named with a leading ``.`` or ``_`` are ignored by
Spark, so writers land a file under a hidden name and rename it when complete.

JSON lines are read line by line, each file whole in one task of its own, so that
a line's number is its position in the task (:func:`whole_file_tasks`). A CSV
file is read whole (``wholetext``) and split in Spark, since every line is
judged against the file's first line, its header. Landing files should stay well
below the memory of one task (tens of MB).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.config import PipelineConfig
from spark_jobs.tables import hadoop_file
from spark_jobs.transforms.parse import BYTE_ORDER_MARK


def ensure_folder(spark: SparkSession, path: str) -> None:
    """Create ``path`` on whatever filesystem it names (the file source needs it to exist)."""
    filesystem, hadoop_path = hadoop_file(spark, path)
    filesystem.mkdirs(hadoop_path)


SOURCE_RECORD = ("raw", "source_partition", "source_file", "source_offset", "ingest_time", "header")
# Spark splits a file into tasks by size; with splits this large, and the cost of
# opening a file as large, every file is read whole, alone in its task.
WHOLE_FILE_TASKS = {
    "spark.sql.files.maxPartitionBytes": str(1 << 40),
    "spark.sql.files.openCostInBytes": str(1 << 40),
}


def numbered_lines(batch: DataFrame) -> DataFrame:
    """A micro-batch of JSON lines with each line's ``source_offset``.

    The stream reads with :data:`WHOLE_FILE_TASKS`, so each file is read whole,
    alone in one task, and a line's number is its position in the task (the low 33
    bits of ``monotonically_increasing_id``, which a stream does not allow but its
    micro-batch does). A task that read only part of a file fails the batch."""
    position = F.monotonically_increasing_id().bitwiseAND((1 << 33) - 1) + 1
    split = F.raise_error(F.concat(F.lit("a task read only part of "), F.col("source_file")))
    number = F.when(F.col("block_start") == 0, position).otherwise(split).cast("long")
    return batch.select(*SOURCE_RECORD[:3], number.alias("source_offset"), *SOURCE_RECORD[4:])


def split_lines(files: DataFrame) -> DataFrame:
    """One row per record of whole CSV files (``value``): ``raw``, its 1-based
    ``source_offset`` and the file's ``header``, its first line.

    A trailing newline does not make an extra (empty) record; other blank lines
    do, and are rejected as empty records downstream."""
    text = F.col("value")
    unmarked = F.when(text.startswith(BYTE_ORDER_MARK), text.substr(F.lit(2), F.length(text))).otherwise(text)
    # Split once per file and keep only small columns beside the exploded lines:
    # anything that refers to the whole file after the explode is paid per line.
    arrays = files.select(F.split(unmarked, "\n", -1).alias("lines"), "source_file", "ingest_time").select(
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
    kept = exploded.where(~trailing & (F.col("pos") > 0))
    return kept.select(
        without_carriage_return(F.col("line")).alias("raw"),
        F.lit(None).cast("string").alias("source_partition"),
        "source_file",
        (F.col("pos") + 1).cast("long").alias("source_offset"),
        "ingest_time",
        without_carriage_return(F.col("header")).alias("header"),
    )


def without_carriage_return(line: Column) -> Column:
    """A CRLF file's line without its ``\\r`` (a plain test, not a regex per line)."""
    return F.when(line.endswith("\r"), line.substr(F.lit(1), F.length(line) - 1)).otherwise(line)


def whole_file_session(spark: SparkSession) -> SparkSession:
    """A session of the same application and settings, but reading each file whole in
    one task (:data:`WHOLE_FILE_TASKS`), so that no other query's reads change: a file
    stream plans its batches' reads with the session it was created in."""
    session = spark.newSession()
    for key, value in {**spark.conf.getAll, **WHOLE_FILE_TASKS}.items():
        if session.conf.isModifiable(key):
            session.conf.set(key, value)
    return session


def read_landing(spark: SparkSession, config: PipelineConfig, landing_path: str) -> DataFrame:
    ensure_folder(spark, landing_path)
    is_csv = config.source.format == "csv"
    reader = (spark if is_csv else whole_file_session(spark)).readStream.format("text")
    reader = reader.option("wholetext", "true") if is_csv else reader.option("lineSep", "\n")
    if config.source.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", config.source.max_files_per_trigger)
    source_file = F.col("_metadata.file_path").alias("source_file")
    ingest_time = F.col("_metadata.file_modification_time").alias("ingest_time")
    if is_csv:
        return split_lines(reader.load(landing_path).select("value", source_file, ingest_time))
    return reader.load(landing_path).select(
        without_carriage_return(F.col("value")).alias("raw"),
        F.lit(None).cast("string").alias("source_partition"),
        source_file,
        F.col("_metadata.file_block_start").alias("block_start"),  # numbered per batch
        ingest_time,
        F.lit(None).cast("string").alias("header"),
    )
