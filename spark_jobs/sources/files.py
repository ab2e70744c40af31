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
import json
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import unquote

from pyspark.sql import Column, DataFrame, DataFrameReader, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamReader

from spark_jobs.config import PipelineConfig, once_per_pipeline
from spark_jobs.lakehouse.files import hadoop_file, read_text
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
    (each column costs JVM calls)."""

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


def read_landing(
    spark: SparkSession, config: PipelineConfig, landing_path: str, archive_path: str | None = None
) -> DataFrame:
    """The landing folder as a stream. Files a committed batch read are kept, deleted or
    moved under ``archive_path`` as the pipeline says (Spark's ``cleanSource``), so the
    folder a trigger lists holds what is still to come, not every file ever landed."""
    ensure_folder(spark, landing_path)
    reader = spark.readStream
    if config.source.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", config.source.max_files_per_trigger)
    if config.source.landed_files != "keep":
        reader = reader.option("cleanSource", config.source.landed_files)
    if config.source.landed_files == "archive":
        reader = reader.option("sourceArchiveDir", archive_path)
    if config.source.format == "csv":
        return csv_lines(reader, landing_path)
    return json_lines(reader, config, landing_path)


# A file stream's checkpoint: ``commits/<batch>`` once a micro-batch committed,
# ``offsets/<batch>`` its sources' offsets (a version line, the batch's metadata, then
# a line per source: the file source's ``{"logOffset": n}``), and the file source's log
# ``sources/0``: a file per log offset that took new files, every tenth compacted into
# ``<n>.compact`` with all entries up to it (the files before it are deleted later).
COMMITS, OFFSETS, FILE_SOURCE_LOG = "commits", "offsets", "sources/0"
COMPACT = ".compact"


def committed_log_offset(offset_log: str) -> int:
    """The file source's log offset a micro-batch read up to, from its ``offsets`` file."""
    return int(json.loads(offset_log.splitlines()[2])["logOffset"])


def log_files_up_to(names: Iterable[str], log_offset: int) -> list[str]:
    """The files of a file source's log that hold every entry up to ``log_offset``:
    the last compaction at or before it, then one file per log offset after that."""
    names = set(names)
    compactions = (
        int(n[: -len(COMPACT)]) for n in names if n.endswith(COMPACT) and n[: -len(COMPACT)].isdigit()
    )
    base = max((n for n in compactions if n <= log_offset), default=None)
    first = 0 if base is None else base + 1
    later = [str(n) for n in range(first, log_offset + 1) if str(n) in names]
    return ([] if base is None else [f"{base}{COMPACT}"]) + later


def logged_names(log_file: str, log_offset: int) -> set[str]:
    """The names of the landed files a file source's log file records up to ``log_offset``,
    as the landing folder lists them (the log spells a path URL-encoded: a%20day.json)."""
    entries = (json.loads(line) for line in log_file.splitlines()[1:] if line.strip())
    return {unquote(e["path"].rsplit("/", 1)[-1]) for e in entries if e["batchId"] <= log_offset}


def committed_landing_files(spark: SparkSession, checkpoint: str) -> set[str]:
    """The landed files a file stream with this checkpoint has committed (read and
    written), by name: its last committed micro-batch's offset into the file source's
    log, and the log up to it. Files of rejects only, or of no record, count too; and
    it costs the log's few files, not a read of the table the stream writes."""
    batches = [int(name) for name in _listed(spark, checkpoint, COMMITS) if name.isdigit()]
    if not batches:
        return set()
    log_offset = committed_log_offset(read_text(spark, checkpoint, OFFSETS, str(max(batches))))
    return {
        name
        for log_file in log_files_up_to(_listed(spark, checkpoint, FILE_SOURCE_LOG), log_offset)
        for name in logged_names(read_text(spark, checkpoint, FILE_SOURCE_LOG, log_file), log_offset)
    }


def _listed(spark: SparkSession, folder: str, child: str) -> list[str]:
    """The names in ``folder``/``child``; none when it does not exist."""
    filesystem, path = hadoop_file(spark, folder, child)
    return (
        [status.getPath().getName() for status in filesystem.listStatus(path)]
        if filesystem.exists(path)
        else []
    )
