"""The file landing zone: JSON-lines or CSV files, picked up as they land.

Each file is read whole (``wholetext``) and split into lines in Spark, so that
every record keeps a deterministic coordinate: its file and 1-based line
number (``source_offset``). A JSON file's lines are parsed at once
(:func:`~spark_jobs.transforms.parse.with_json_file_read`), each line taking its
element. ``ingest_time`` is the file's arrival (modification) time. Files named
with a leading ``.`` or ``_`` are ignored by Spark, so writers land a file under
a hidden name and rename it when complete. A CSV file's first line is its header.
Landing files should stay well below the memory of one task (tens of MB).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.config import PipelineConfig
from spark_jobs.tables import hadoop_file
from spark_jobs.transforms.parse import FILE_READ, with_json_file_read


def file_columns() -> list[Column]:
    """A landed file as the text source reads it whole: its text and where and when it landed."""
    return [
        F.col("value"),
        F.col("_metadata.file_path").alias("source_file"),
        F.col("_metadata.file_modification_time").alias("ingest_time"),
    ]


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
    arrays: list[Column]
    per_file: dict[str, Column]
    exploded: list[Column]
    pair_fields: list[Column]
    kept: Column
    records: list[Column]

    @classmethod
    @functools.cache
    def of(cls, has_header: bool, typed: bool) -> LineSplit:
        """``typed``: the files carry their ``file_read``, which each line takes its element of."""
        columns = {"line": F.col("lines")}
        if typed:
            whole = F.size(FILE_READ) == F.col("line_count")
            columns["typed"] = F.when(whole, F.col(FILE_READ)).otherwise(F.array())
        # Paired before the explode (the shorter padded with nulls): a line's row carries
        # its own element, not the file's array.
        pairs = F.arrays_zip(*(column.alias(name) for name, column in columns.items()))
        trailing = (F.col("pos") == F.col("line_count") - 1) & (F.col("line") == "")
        header = without_carriage_return(F.col("header")) if has_header else F.lit(None).cast("string")
        per_line = ("source_file", "ingest_time")
        return cls(
            lines=F.split(F.col("value"), "\n", -1),
            arrays=[F.col(name) for name in ("lines", *([FILE_READ] if typed else []), *per_line)],
            per_file={"line_count": F.size("lines"), "header": F.col("lines").getItem(0)},
            exploded=[
                F.posexplode(pairs).alias("pos", "pair"),
                *map(F.col, ("line_count", "header", *per_line)),
            ],
            pair_fields=[F.col("*"), *(F.col("pair").getField(name).alias(name) for name in columns)],
            kept=~trailing & (F.col("pos") > 0 if has_header else F.lit(True)),
            records=[
                without_carriage_return(F.col("line")).alias("raw"),
                F.lit(None).cast("string").alias("source_partition"),
                F.col("source_file"),
                (F.col("pos") + 1).cast("long").alias("source_offset"),
                F.col("ingest_time"),
                header.alias("header"),
                *(F.col(name) for name in columns if name != "line"),
            ],
        )


def split_lines(
    files: DataFrame, has_header: bool, read_file: Callable[[DataFrame], DataFrame] | None = None
) -> DataFrame:
    """One row per record: ``raw``, its 1-based ``source_offset`` and the file's ``header``,
    and, when ``read_file`` is given, ``typed``: the record's element of the
    ``file_read`` that ``read_file`` adds to the files (their text in ``value``, split
    at its newlines in ``lines``): an array with one element per line, or else
    ``typed`` is null.

    A trailing newline does not make an extra (empty) record; other blank lines
    do, and are rejected as empty records downstream."""
    split = LineSplit.of(has_header, read_file is not None)
    # Split once per file and keep only small columns beside the exploded lines:
    # anything that refers to the whole file after the explode is paid per line.
    files = files.withColumn("lines", split.lines)
    arrays = (
        (files if read_file is None else read_file(files)).select(*split.arrays).withColumns(split.per_file)
    )
    exploded = arrays.select(*split.exploded).select(*split.pair_fields)
    return exploded.where(split.kept).select(*split.records)


def without_carriage_return(line: Column) -> Column:
    """A CRLF file's line without its ``\\r`` (a plain test, not a regex per line)."""
    return F.when(line.endswith("\r"), line.substr(F.lit(1), F.length(line) - 1)).otherwise(line)


def landing_records(files: DataFrame, config: PipelineConfig) -> DataFrame:
    """The records of landed files (``value``: a file's text, ``source_file``,
    ``ingest_time``): a JSON file's lines come with its typed read, parsed at once."""
    if config.source.format == "csv":
        return split_lines(files, has_header=True)
    return split_lines(files, has_header=False, read_file=lambda files: with_json_file_read(files, config))


def read_landing(spark: SparkSession, config: PipelineConfig, landing_path: str) -> DataFrame:
    ensure_folder(spark, landing_path)
    reader = spark.readStream.format("text").option("wholetext", "true")
    if config.source.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", config.source.max_files_per_trigger)
    return landing_records(reader.load(landing_path).select(*file_columns()), config)
