"""Raw records -> typed bronze rows or rejects with a reason (never a silent drop).

Input (from a source reader): ``raw`` (the record's text), ``source_partition``
(Kafka's partition, or null for files: then taken from the payload's partition
column), ``source_file``, ``source_offset``, ``ingest_time`` and, for CSV,
``header`` (the file's first line).

Every payload field is first read as text, then converted with ``try_cast``:
a value that is present but does not convert is a wrong type, not a null.
One record gets one reason, the first that applies in :data:`REASONS` order.
"""

from __future__ import annotations

from datetime import datetime
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.config import PipelineConfig
from spark_jobs.sql import quote_identifier
from spark_jobs.transforms.timestamps import event_time_millis, in_timestamp_range, millis_to_timestamp

REASONS = (
    "empty_record",
    "malformed_record",
    "csv_header_mismatch",
    "missing_key",
    "missing_timestamp",
    "unparseable_timestamp",
    "timestamp_out_of_range",
    "future_timestamp",
    "wrong_type",
    "missing_partition",
)
CORRUPT = "_corrupt_record"
SOURCE_COLUMNS = ("source_partition", "source_file", "source_offset", "ingest_time")
BYTE_ORDER_MARK = "\ufeff"


def _text_schema(config: PipelineConfig) -> str:
    return ", ".join(f"{quote_identifier(name)} STRING" for name in (*config.schema, CORRUPT))


def _with_fields_as_text(raw: DataFrame, config: PipelineConfig) -> DataFrame:
    """``raw`` with ``text``: the record's fields as text, or null unless the record is
    one JSON object (one CSV row) and nothing else."""
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
    line = F.col("raw")
    if config.source.format == "csv":
        # RFC 4180 quoting (a quote inside a quoted field is doubled), as Python's csv
        # module and most writers produce it; Spark's default escape is a backslash.
        # Spark's CSV parser may take a U+FEFF that begins a line for a byte-order mark
        # and drop it, depending on its state: such a line is parsed with a plain letter
        # in the mark's place, and the mark is put back into the first field.
        marked = line.startswith(BYTE_ORDER_MARK)
        guarded = F.when(marked, F.concat(F.lit("x"), line.substr(F.lit(2), F.length(line)))).otherwise(line)
        parsed = raw.withColumn("text", F.from_csv(guarded, _text_schema(config), {**options, "escape": '"'}))
        first_field = next(iter(config.schema))
        first = F.col("text").getField(first_field)
        restored = F.concat(F.lit(BYTE_ORDER_MARK), first.substr(F.lit(2), F.length(first)))
        text = F.when(marked, F.col("text").withField(first_field, restored)).otherwise(F.col("text"))
        return parsed.withColumn("text", text)
    # Spark's JSON parser stops after the first value and ignores the rest of the line,
    # so `{...}{...}` would land its first record and silently drop the second. As the
    # only element of an array, anything after the object is a syntax error or a second
    # element; an array closed early by the line itself (`{...}] ...`) is caught by
    # reading the line as an object's member as well (only lines with a `]`). One parse
    # into the array costs a fifth more than a plain one; a separate check, half.
    array_schema = f"ARRAY<STRUCT<{_text_schema(config)}>>"
    elements = F.from_json(F.concat(F.lit("["), line, F.lit("]")), array_schema, options)
    as_member = F.from_json(F.concat(F.lit('{"r":'), line, F.lit("}")), "r STRUCT<>").getField("r")
    alone = (F.size("elements") == 1) & (~line.contains("]") | as_member.isNotNull())
    # Its own column, so the array is parsed once however often it is referred to.
    return raw.withColumn("elements", elements).withColumn("text", F.when(alone, F.col("elements")[0]))


def _first(conditions: list[tuple[Column, Column]]) -> Column:
    """The value of the first condition that holds (a CASE WHEN chain), else null."""
    chosen = F.when(*conditions[0])
    for condition, value in conditions[1:]:
        chosen = chosen.when(condition, value)
    return chosen


def _any(conditions: list[Column]) -> Column:
    return reduce(lambda left, right: left | right, conditions)


def _is_marker(config: PipelineConfig) -> Column:
    marker = config.watermark.marker_column
    return F.col("text").getField(marker).isNotNull() if marker else F.lit(False)


def parse_records(raw: DataFrame, config: PipelineConfig, processing_time: datetime) -> DataFrame:
    """Add the typed payload, the bronze columns, and ``reason``/``detail`` (null when valid)."""
    text = {name: F.col("text").getField(name) for name in config.schema}
    typed = {
        name: value if config.schema[name] == "string" else value.try_cast(config.schema[name])
        for name, value in text.items()
    }
    stamp = config.event_time
    millis = event_time_millis(text[stamp.column], stamp)
    horizon = F.lit(int(processing_time.timestamp() * 1000) + stamp.max_future_skew_ms)
    is_data = ~_is_marker(config)
    corrupt = F.col("text").isNull() | F.col("text").getField(CORRUPT).isNotNull()

    wrong_types = [
        (
            text[name].isNotNull() & typed[name].isNull(),
            F.format_string(f"{name}: %s is not a {kind}", text[name]),
        )
        for name, kind in config.schema.items()
        if kind != "string"
    ]
    missing_keys = [(text[name].isNull(), F.lit(f"{name} is missing")) for name in config.key]
    partition = config.partition_column
    checks: list[tuple[str, Column, Column]] = [
        ("empty_record", F.col("raw").isNull() | (F.trim(F.col("raw")) == ""), F.lit("no content")),
        ("malformed_record", corrupt, F.lit(f"not a valid {config.source.format.upper()} record")),
        ("missing_key", is_data & _any([c for c, _ in missing_keys]), _first(missing_keys)),
        ("missing_timestamp", text[stamp.column].isNull(), F.lit(f"{stamp.column} is missing")),
        (
            "unparseable_timestamp",
            millis.isNull(),
            F.format_string(f"{stamp.column}: %s is not {stamp.format}", text[stamp.column]),
        ),
        (
            "timestamp_out_of_range",
            ~in_timestamp_range(millis),
            F.format_string(f"{stamp.column}: %s is outside years 1-9999", text[stamp.column]),
        ),
        (
            "future_timestamp",
            is_data & (millis > horizon),
            F.format_string(f"{stamp.column}: %s is beyond the allowed future skew", text[stamp.column]),
        ),
    ]
    if config.source.format == "csv":
        expected = ",".join(config.schema)
        mismatch = F.col("header") != F.lit(expected)
        checks.insert(
            2,
            (
                "csv_header_mismatch",
                mismatch,
                F.format_string(f"file header %s is not {expected}", F.col("header")),
            ),
        )
    if wrong_types:
        checks.append(("wrong_type", _any([c for c, _ in wrong_types]), _first(wrong_types)))
    if partition is not None and config.source.kind == "files":
        checks.append(("missing_partition", text[partition].isNull(), F.lit(f"{partition} is missing")))

    origin = F.coalesce(F.substring_index(F.col("source_file"), "/", -1), F.lit(config.source.topic or ""))
    source_partition = F.coalesce(
        F.col("source_partition"), typed[partition].cast("string") if partition else F.lit(None)
    )
    return _with_fields_as_text(raw, config).select(
        *[typed[name].alias(name) for name in config.schema],
        F.col("raw"),
        # readable and unique by construction: file:line, or topic:partition:offset
        F.concat_ws(":", origin, F.col("source_partition"), F.col("source_offset")).alias("event_id"),
        source_partition.alias("source_partition"),
        F.col("source_file"),
        F.col("source_offset"),
        millis_to_timestamp(millis).alias("event_time"),
        F.col("ingest_time"),
        F.lit(processing_time).cast("timestamp").alias("processing_time"),
        _first([(condition, F.lit(reason)) for reason, condition, _ in checks]).alias("reason"),
        _first([(condition, detail) for _, condition, detail in checks]).alias("detail"),
    )


def bronze_rows(parsed: DataFrame, bronze_columns: list[str]) -> DataFrame:
    return parsed.where(F.col("reason").isNull()).select(*bronze_columns)


def reject_rows(parsed: DataFrame, pipeline: str, rejected_at: datetime) -> DataFrame:
    return parsed.where(F.col("reason").isNotNull()).select(
        F.lit(pipeline).alias("pipeline"),
        F.col("raw").alias("raw_record"),
        F.col("reason"),
        F.col("detail"),
        *SOURCE_COLUMNS,
        F.lit(rejected_at).cast("timestamp").alias("rejected_at"),
    )
