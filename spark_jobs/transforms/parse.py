"""Raw records -> typed bronze rows or rejects with a reason (never a silent drop).

Input (from a source reader): ``raw`` (the record's text), ``source_partition``
(Kafka's partition, or null for files: then taken from the payload's partition
column), ``source_file`` and ``source_name`` (a file's path and name, null for
Kafka), ``source_offset``, ``ingest_time``, for CSV
``header`` (the file's first line), and, from a JSON file, ``typed`` and
``one_object``: the line's typed read and byte scan (:func:`surely_one_object`),
made by the landing zone's reader as it splits the file into lines.

A payload field's value is what ``try_cast`` makes of its text: a value that is
present but does not convert is a wrong type, not a null. Most JSON records are
read once at the schema's types (as a Spark user's JSON source reads them); the
rest are read again with every field
as text, and both ways give one answer. One record gets one reason, the first that
applies in :data:`REASONS` order.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.config import PipelineConfig, once_per_pipeline
from spark_jobs.eventtime.windows import GAP_ABOVE_MAX, GAP_MISSING, GAP_NOT_POSITIVE, SessionSpec
from spark_jobs.sql import compiled_from_json, quote_identifier, with_constants
from spark_jobs.transforms.timestamps import (
    EPOCH_SCALE,
    event_time_millis,
    in_timestamp_range,
    millis_to_timestamp,
)

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
    GAP_MISSING,
    GAP_NOT_POSITIVE,
    GAP_ABOVE_MAX,
    "missing_partition",
)
CORRUPT = "_corrupt_record"
SOURCE_COLUMNS = ("source_partition", "source_file", "source_offset", "ingest_time")
BYTE_ORDER_MARK = "\ufeff"


def _text_schema(config: PipelineConfig) -> str:
    return ", ".join(f"{quote_identifier(name)} STRING" for name in (*config.schema, CORRUPT))


# Kinds whose JSON conversion gives what ``try_cast`` of the field's text gives, once
# the value converted and (a double) is finite. A timestamp or date converts by
# Spark's JSON options, not by the cast; a float may round twice (through a double)
# on one path and once on the other: those stay text. So does the event-time column,
# unless it holds whole epoch numbers (an int or long kind): their text casts to the
# same number, and the millisecond is that number scaled.
JSON_TYPED_KINDS = ("int", "long", "double", "boolean")
WHOLE_KINDS = ("int", "long")
PERMISSIVE = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}


def _typed_stamp(config: PipelineConfig) -> bool:
    """The event-time column is read at its type on the fast path."""
    stamp = config.event_time
    return stamp.format in EPOCH_SCALE and config.schema[stamp.column] in WHOLE_KINDS


def _json_typed_fields(config: PipelineConfig) -> dict[str, str]:
    """The fields the fast path reads at their own type, with their kinds."""
    stamp = config.event_time.column
    return {
        name: kind
        for name, kind in config.schema.items()
        if kind in JSON_TYPED_KINDS and (name != stamp or _typed_stamp(config))
    }


def typed_read_schema(config: PipelineConfig) -> str:
    """The fields of a JSON record's typed read: the fast path's kinds at their type,
    the rest as text, and the corrupt-record flag."""
    typed = _json_typed_fields(config)
    return ", ".join(
        f"{quote_identifier(name)} {typed.get(name, 'string').upper()}" for name in (*config.schema, CORRUPT)
    )


def _one_value(line: Column, values_in_brackets: Column) -> Column:
    """The line is one JSON value and nothing else: it is the only element of an array
    made by bracketing it. A line may close that array early (``{...}] ...``), which is
    caught by reading it as an object's member too (only lines with a ``]``)."""
    as_member = compiled_from_json(F.concat(F.lit('{"r":'), line, F.lit("}")), "r STRUCT<>", {}).getField("r")
    return (values_in_brackets == 1) & (~line.contains("]") | as_member.isNotNull())


def surely_one_object(line: Column) -> Column:
    """A byte scan that holds only for a line that, if it parses as an object, is that
    object and nothing else: it begins with ``{`` and its only ``}`` is its last
    character (an object ends at a ``}`` outside its strings). Lines it does not
    hold for (nested objects, a ``}`` in a string) take the bracketed reads.

    The scan is over the line's bytes (no UTF-8 byte of another character is a
    ``}``): ``instr`` and ``length`` count characters, a cost the byte scan avoids.
    The landing zone's reader makes the same scan as it splits a file into lines
    (``one_object``, ``spark_jobs/java/io/tidemark/bronze/JsonLinesFormat.java``)."""
    before_last = F.substring(line.cast("binary"), 1, F.octet_length(line) - 1)
    return line.startswith("{") & line.endswith("}") & ~before_last.contains(F.lit(bytearray(b"}")))


def _parsed_field_steps(
    config: PipelineConfig, typed_given: bool, horizon: Column
) -> list[tuple[str, Column]]:
    """The columns, each added in turn, that give a raw record ``fast``, ``typed`` and
    ``text`` (``typed_given``: the raw records carry ``typed`` and ``one_object``, as
    the landing zone's JSON-lines reader gives them).

    ``fast`` marks a JSON line that is one object whose typed fields all converted:
    ``typed`` holds its fields (the kinds of :func:`_json_typed_fields` at their type,
    the rest as text) in one typed parse, the one a Spark user's JSON source does.
    Every other record is read again, all fields as text (``text``: null unless the
    record is one JSON object, or one CSV row, and nothing else), so that what does
    not convert is named (``wrong_type``) rather than nulled. Both paths give a
    record the same values and the same verdict; the fast one skips the second parse
    and the per-field casts for the records that need neither."""
    line = F.col("raw")
    if config.source.format == "csv":
        # RFC 4180 quoting (a quote inside a quoted field is doubled), as Python's csv
        # module and most writers produce it; Spark's default escape is a backslash.
        # Spark's CSV parser may take a U+FEFF that begins a line for a byte-order mark
        # and drop it, depending on its state: such a line is parsed with a plain letter
        # in the mark's place, and the mark is put back into the first field.
        marked = line.startswith(BYTE_ORDER_MARK)
        guarded = F.when(marked, F.concat(F.lit("x"), line.substr(F.lit(2), F.length(line)))).otherwise(line)
        first_field = next(iter(config.schema))
        first = F.col("text").getField(first_field)
        restored = F.concat(F.lit(BYTE_ORDER_MARK), first.substr(F.lit(2), F.length(first)))
        return [
            ("text", F.from_csv(guarded, _text_schema(config), {**PERMISSIVE, "escape": '"'})),
            ("text", F.when(marked, F.col("text").withField(first_field, restored)).otherwise(F.col("text"))),
            ("fast", F.lit(False)),
            ("typed", F.lit(None).cast(f"STRUCT<{typed_read_schema(config)}>")),
        ]
    # Spark's JSON parser stops after the first value and ignores the rest of the line,
    # so `{...}{...}` would land its first record and silently drop the second: hence
    # the bracketed reads. Inside an array a value that does not convert is nulled
    # without a trace, so the typed parse reads the line alone, where it is flagged in
    # the corrupt column, and a byte scan checks the rest: counting the bracketed
    # values would tokenize every line a second time and cost what the typed parse saves.
    # The landing zone's reader hands each JSON line both, read as it splits the file.
    typed = F.col("typed")
    json_typed = _json_typed_fields(config)
    steps = (
        []
        if typed_given
        else [
            ("typed", F.from_json(line, typed_read_schema(config), PERMISSIVE)),
            ("one_object", surely_one_object(line)),
        ]
    )
    vouched = F.col("one_object") & typed.getField(CORRUPT).isNull()
    # JSON reads a number beyond the type's range as infinite; its text does not cast.
    finite = [
        ~typed.getField(name).isin(float("inf"), float("-inf"))
        for name, kind in json_typed.items()
        if kind == "double"
    ]
    # A typed event time takes the fast path only when it passes every check, so that
    # no reject's detail needs its text.
    millis = _typed_millis(config)
    stamp_ok = [] if millis is None else [in_timestamp_range(millis) & ~_beyond_horizon(millis, horizon)]
    fast = F.coalesce(_all([vouched, *finite, *stamp_ok]), F.lit(False))
    bracketed = F.concat(F.lit("["), line, F.lit("]"))
    elements = compiled_from_json(bracketed, f"ARRAY<STRUCT<{_text_schema(config)}>>", PERMISSIVE)
    # Each its own column, so a parse runs once however often it is referred to, and
    # the text parse only for the records the fast path did not take. A fast record
    # has no elements, but a null size does not stop the AND of _one_value: without
    # the guard every line would still be scanned for a `]`.
    slow = ~F.col("fast")
    return [
        *steps,
        ("fast", fast),
        ("elements", F.when(slow, elements)),
        ("text", F.when(slow & _one_value(line, F.size("elements")), F.col("elements")[0])),
    ]


def _beyond_horizon(millis: Column, horizon: Column) -> Column:
    """An event time later than the processing time plus the allowed future skew."""
    return millis > horizon


def _typed_millis(config: PipelineConfig) -> Column | None:
    """The event time in epoch milliseconds from the typed parse, when it reads the
    event-time column at its type (:func:`_typed_stamp`): null on overflow, as the
    text's conversion would leave the long path."""
    if not _typed_stamp(config):
        return None
    whole = F.col("typed").getField(config.event_time.column).cast("long")
    scale = EPOCH_SCALE[config.event_time.format]
    return whole if scale == 1 else F.try_multiply(whole, F.lit(scale))


def _first(conditions: list[tuple[Column, Column]]) -> Column:
    """The value of the first condition that holds (a CASE WHEN chain), else null."""
    chosen = F.when(*conditions[0])
    for condition, value in conditions[1:]:
        chosen = chosen.when(condition, value)
    return chosen


def _any(conditions: list[Column]) -> Column:
    return reduce(lambda left, right: left | right, conditions)


def _all(conditions: list[Column]) -> Column:
    return reduce(lambda left, right: left & right, conditions)


@dataclass(frozen=True)
class Field:
    """One payload field as the record carries it, from whichever path read it."""

    present: Column  # the record has a non-null value for it
    value: Column  # at the schema's type; null when absent or when it does not convert
    shown: Column  # its text, for details


def _fields(config: PipelineConfig) -> dict[str, Field]:
    fast = F.col("fast")
    json_typed = _json_typed_fields(config)
    fields = {}
    for name, kind in config.schema.items():
        read_typed, read_as_text = F.col("typed").getField(name), F.col("text").getField(name)
        if name in json_typed:
            fields[name] = Field(
                present=F.when(fast, read_typed.isNotNull()).otherwise(read_as_text.isNotNull()),
                value=F.when(fast, read_typed).otherwise(read_as_text.try_cast(kind)),
                shown=read_as_text,  # a detail names a value only for records the fast path left
            )
        else:
            text = F.when(fast, read_typed).otherwise(read_as_text)
            fields[name] = Field(text.isNotNull(), text if kind == "string" else text.try_cast(kind), text)
    return fields


# The micro-batch's processing time, and the latest event time it accepts (the
# processing time plus the allowed future skew), as data (:func:`with_constants`).
BATCH_CONSTANTS = "batch_processing_time timestamp, batch_horizon_ms long"


@dataclass(frozen=True)
class RecordParse:
    """How a pipeline's raw records become bronze rows or rejects: the columns added
    in turn, then the columns selected, reading the batch's constants as columns."""

    steps: list[tuple[str, Column]]
    columns: list[Column]

    @classmethod
    def of(cls, config: PipelineConfig, typed_given: bool) -> RecordParse:
        """``typed_given``: the raw records carry their typed read and byte scan."""
        fields = _fields(config)
        typed = {name: field.value for name, field in fields.items()}
        stamp = config.event_time
        stamp_text = fields[stamp.column].shown
        # Its own column: each check that reads it would convert the text again.
        # The text's conversion: a decimal, for any epoch number. A typed event time has
        # passed every check on the fast path (:func:`_parsed_field_steps`), and keeps its long.
        millis = F.col("millis")
        typed_millis = _typed_millis(config)
        judged_by_text = F.lit(True) if typed_millis is None else ~F.col("fast")
        horizon = F.col("batch_horizon_ms")
        marker = config.watermark.marker_column
        is_data = ~fields[marker].present if marker else F.lit(True)
        slow = ~F.col("fast")
        corrupt = slow & (F.col("text").isNull() | F.col("text").getField(CORRUPT).isNotNull())

        wrong_types = [
            (
                fields[name].present & typed[name].isNull(),
                F.format_string(f"{name}: %s is not a {kind}", fields[name].shown),
            )
            for name, kind in config.schema.items()
            if kind != "string"
        ]
        missing_keys = [(~fields[name].present, F.lit(f"{name} is missing")) for name in config.key]
        partition = config.partition_column
        checks: list[tuple[str, Column, Column]] = [
            (
                "empty_record",
                slow & (F.col("raw").isNull() | (F.trim(F.col("raw")) == "")),
                F.lit("no content"),
            ),
            ("malformed_record", corrupt, F.lit(f"not a valid {config.source.format.upper()} record")),
            ("missing_key", is_data & _any([c for c, _ in missing_keys]), _first(missing_keys)),
            ("missing_timestamp", ~fields[stamp.column].present, F.lit(f"{stamp.column} is missing")),
            (
                "unparseable_timestamp",
                judged_by_text & millis.isNull(),
                F.format_string(f"{stamp.column}: %s is not {stamp.format}", stamp_text),
            ),
            (
                "timestamp_out_of_range",
                ~in_timestamp_range(millis),
                F.format_string(f"{stamp.column}: %s is outside years 1-9999", stamp_text),
            ),
            (
                "future_timestamp",
                is_data & _beyond_horizon(millis, horizon),
                F.format_string(f"{stamp.column}: %s is beyond the allowed future skew", stamp_text),
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
        checks += _gap_checks(config, fields, is_data)
        if partition is not None and config.source.kind == "files":
            checks.append(("missing_partition", ~fields[partition].present, F.lit(f"{partition} is missing")))

        origin = F.coalesce(F.col("source_name"), F.lit(config.source.topic or ""))
        source_partition = F.coalesce(
            F.col("source_partition"), typed[partition].cast("string") if partition else F.lit(None)
        )
        from_text = event_time_millis(stamp_text, stamp)
        steps = [
            *_parsed_field_steps(config, typed_given, horizon),
            ("millis", F.when(judged_by_text, from_text)),
        ]
        event_time = millis_to_timestamp(millis)
        if typed_millis is not None:
            event_time = F.when(F.col("fast"), F.timestamp_millis(typed_millis)).otherwise(event_time)
        return cls(
            steps,
            [
                *[typed[name].alias(name) for name in config.schema],
                F.col("raw"),
                # readable and unique by construction: file:line, or topic:partition:offset
                F.concat_ws(":", origin, F.col("source_partition"), F.col("source_offset")).alias("event_id"),
                source_partition.alias("source_partition"),
                F.col("source_file"),
                F.col("source_offset"),
                event_time.alias("event_time"),
                F.col("ingest_time"),
                F.col("batch_processing_time").alias("processing_time"),
                _first([(condition, F.lit(reason)) for reason, condition, _ in checks]).alias("reason"),
                _first([(condition, detail) for _, condition, detail in checks]).alias("detail"),
            ],
        )


def _gap_checks(
    config: PipelineConfig, fields: dict[str, Field], is_data: Column
) -> list[tuple[str, Column, Column]]:
    """A session pipeline's per-record gap (DESIGN §2c): a data record needs one in
    ``(0, max_gap]``. A gap of the wrong type is a ``wrong_type`` first."""
    window = config.window
    if not isinstance(window, SessionSpec) or window.gap_column is None:
        return []
    field = fields[window.gap_column]
    gap = field.value
    # Its value, not its text: a record the typed read took carries no text.
    shown = F.format_string(f"{window.gap_column}: %s", gap.cast("string"))
    return [
        (GAP_MISSING, is_data & ~field.present, F.lit(f"{window.gap_column} is missing")),
        (GAP_NOT_POSITIVE, is_data & (gap <= 0), F.concat(shown, F.lit(" is not a positive gap"))),
        (
            GAP_ABOVE_MAX,
            is_data & (gap > window.max_gap_ms),
            F.concat(shown, F.lit(f" is above window.max_gap ({window.max_gap_ms} ms)")),
        ),
    ]


record_parse = once_per_pipeline(RecordParse.of)


def parse_records(raw: DataFrame, config: PipelineConfig, processing_time: datetime) -> DataFrame:
    """Add the typed payload, the bronze columns, and ``reason``/``detail`` (null when valid)."""
    parse = record_parse(config, "typed" in raw.columns)
    horizon_ms = int(processing_time.timestamp() * 1000) + config.event_time.max_future_skew_ms
    parsed = with_constants(raw, (processing_time, horizon_ms), BATCH_CONSTANTS)
    for name, column in parse.steps:
        parsed = parsed.withColumn(name, column)
    return parsed.select(*parse.columns)


def bronze_rows(parsed: DataFrame, bronze_columns: list[str]) -> DataFrame:
    return parsed.where(F.col("reason").isNull()).select(*bronze_columns)


def reject_rows(parsed: DataFrame, pipeline: str) -> DataFrame:
    """The rejected records of ``parsed``, rejected at its processing time."""
    return parsed.where(F.col("reason").isNotNull()).select(
        F.lit(pipeline).alias("pipeline"),
        F.col("raw").alias("raw_record"),
        F.col("reason"),
        F.col("detail"),
        *SOURCE_COLUMNS,
        F.col("processing_time").alias("rejected_at"),
    )
