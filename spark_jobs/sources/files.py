"""The file landing zone: JSON-lines or CSV files, picked up as they land.

Every record keeps a deterministic coordinate: its file and 1-based line number
(``source_offset``). A JSON-lines file is read by Tidemark's own file format
(:data:`JSON_LINES`, compiled at setup), which splits it into lines and reads each
at the schema's types in one pass over its bytes; a CSV file is read whole
(``wholetext``) and split into lines in Spark. ``ingest_time`` is the file's
arrival (modification) time. Files named
with a leading ``.`` or ``_`` are ignored by Spark, so writers land a file under
a hidden name and rename it when complete. A CSV file's first line is its header;
a CSV file should stay well below the memory of one task (tens of MB), a JSON-lines
file is read a buffer at a time.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, DataFrameReader, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamReader

from spark_jobs.config import PipelineConfig, once_per_pipeline
from spark_jobs.tables import hadoop_file
from spark_jobs.transforms.parse import typed_read_schema

JSON_LINES = "io.tidemark.bronze.JsonLinesFormat"


def landing_columns() -> list[Column]:
    """Where and when a landed file landed, from any file source's metadata: its path,
    its name (the path's last segment, as the path spells it; made once a file, where
    cutting it out of the path was a scan of every row's path) and its arrival."""
    return [
        F.col("_metadata.file_path").alias("source_file"),
        F.col("_metadata.file_name").alias("source_name"),
        F.col("_metadata.file_modification_time").alias("ingest_time"),
    ]


def file_columns() -> list[Column]:
    """A landed file as the text source reads it whole: its text and where and when it landed."""
    return [F.col("value"), *landing_columns()]


def ensure_folder(spark: SparkSession, path: str) -> None:
    """Create ``path`` on whatever filesystem it names (the file source needs it to exist)."""
    filesystem, hadoop_path = hadoop_file(spark, path)
    filesystem.mkdirs(hadoop_path)


@dataclass(frozen=True)
class LineSplit:
    """The columns that turn a landed file into one row per line, each selected in
    turn (:func:`split_lines`): built once per shape, not on every stream's start
    (each column costs JVM calls, a few hundred in all)."""

    lines: Column
    per_file: dict[str, Column]
    exploded: list[Column]
    kept: Column
    records: list[Column]

    @classmethod
    @functools.cache
    def of(cls, has_header: bool) -> LineSplit:
        trailing = (F.col("pos") == F.col("line_count") - 1) & (F.col("line") == "")
        header = without_carriage_return(F.col("header")) if has_header else F.lit(None).cast("string")
        per_line = ("source_file", "source_name", "ingest_time")
        return cls(
            lines=F.split(F.col("value"), "\n", -1),
            per_file={"line_count": F.size("lines"), "header": F.col("lines").getItem(0)},
            exploded=[
                F.posexplode("lines").alias("pos", "line"),
                *map(F.col, ("line_count", "header", *per_line)),
            ],
            kept=~trailing & (F.col("pos") > 0 if has_header else F.lit(True)),
            records=[
                without_carriage_return(F.col("line")).alias("raw"),
                F.lit(None).cast("string").alias("source_partition"),
                F.col("source_file"),
                F.col("source_name"),
                (F.col("pos") + 1).cast("long").alias("source_offset"),
                F.col("ingest_time"),
                header.alias("header"),
            ],
        )


def split_lines(files: DataFrame, has_header: bool) -> DataFrame:
    """One row per record: ``raw``, its 1-based ``source_offset`` and the file's ``header``.

    A trailing newline does not make an extra (empty) record; other blank lines
    do, and are rejected as empty records downstream."""
    split = LineSplit.of(has_header)
    # Split once per file and keep only small columns beside the exploded lines:
    # anything that refers to the whole file after the explode is paid per line.
    arrays = files.select(
        split.lines.alias("lines"), "source_file", "source_name", "ingest_time"
    ).withColumns(split.per_file)
    return arrays.select(*split.exploded).where(split.kept).select(*split.records)


def without_carriage_return(line: Column) -> Column:
    """A CRLF file's line without its ``\\r`` (a plain test, not a regex per line)."""
    return F.when(line.endswith("\r"), line.substr(F.lit(1), F.length(line) - 1)).otherwise(line)


@once_per_pipeline
def _json_lines_columns(config: PipelineConfig) -> tuple[str, list[Column]]:
    """The JSON-lines reader's schema and the raw records' columns of its rows."""
    schema = f"raw STRING, source_offset LONG, one_object BOOLEAN, typed STRUCT<{typed_read_schema(config)}>"
    return schema, [
        F.col("raw"),
        F.lit(None).cast("string").alias("source_partition"),
        *landing_columns(),
        F.col("source_offset"),
        F.lit(None).cast("string").alias("header"),
        F.col("one_object"),
        F.col("typed"),
    ]


def json_lines(reader: DataFrameReader | DataStreamReader, config: PipelineConfig, path: str) -> DataFrame:
    """The raw records of the JSON-lines files at ``path`` (``reader``: a batch or a
    stream reader), each line with its typed read and byte scan (:data:`JSON_LINES`)."""
    schema, columns = _json_lines_columns(config)
    return reader.format(JSON_LINES).schema(schema).load(path).select(*columns)


def csv_lines(reader: DataFrameReader | DataStreamReader, path: str) -> DataFrame:
    """The raw records of the CSV files at ``path``, each with its file's header."""
    files = reader.format("text").option("wholetext", "true").load(path).select(*file_columns())
    return split_lines(files, has_header=True)


def read_landing(spark: SparkSession, config: PipelineConfig, landing_path: str) -> DataFrame:
    ensure_folder(spark, landing_path)
    reader = spark.readStream
    if config.source.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", config.source.max_files_per_trigger)
    if config.source.format == "csv":
        return csv_lines(reader, landing_path)
    return json_lines(reader, config, landing_path)
