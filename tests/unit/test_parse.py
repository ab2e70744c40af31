"""Record parsing and timestamp assignment on tiny inline DataFrames."""

import contextlib
import csv
import io
import json
import os
import re
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from py4j.clientserver import ClientServerConnection
from pyspark.sql import Row, SparkSession
from pyspark.sql import functions as F

from spark_jobs.config import ConfigError, PipelineConfig, parse_pipeline
from spark_jobs.jobs import bronze
from spark_jobs.jobs.common import JobContext
from spark_jobs.sources.files import csv_lines, json_lines, read_landing, split_lines
from spark_jobs.sql import compiled_from_json
from spark_jobs.tables import TableRegistry
from spark_jobs.transforms.parse import (
    PERMISSIVE,
    parse_records,
    surely_one_object,
    typed_read_schema,
)
from tests.generated_code import classes_compiled, expressions_compiled
from tests.unit.test_config import PIPELINES

pytestmark = pytest.mark.spark

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
RAW_SCHEMA = (
    "raw string, source_partition string, source_file string, source_name string, "
    "source_offset long, ingest_time timestamp, header string"
)


def config(**changes):
    document = yaml.safe_load((PIPELINES / "telemetry.yaml").read_text())
    for path, value in changes.items():
        section = document
        *parents, last = path.split("__")
        for part in parents:
            section = section[part]
        section[last] = value
    return parse_pipeline(document)


def record(**overrides):
    payload = {"device_id": "d1", "ts": T0, "region": "north", "battery": 80.5, "speed": 3.0, "partition": 2}
    payload.update(overrides)
    return json.dumps({k: v for k, v in payload.items() if v is not ...})


def raw_records(spark, lines, source_partition=None):
    """Each line a record of its own, as a Kafka source gives them."""
    rows = [
        (line, source_partition, "/landing/f.json", "f.json", i + 1, NOW, None)
        for i, line in enumerate(lines)
    ]
    return spark.createDataFrame(rows, RAW_SCHEMA)


def parse(spark, lines, cfg=None, source_partition=None):
    return parse_records(raw_records(spark, lines, source_partition), cfg or config(), NOW).collect()


def file_text(lines) -> bytes:
    return "".join(f"{line}\n" for line in lines).encode()


@contextlib.contextmanager
def landed(text: bytes, name: str = "f.json") -> Iterator[str]:
    """A landing folder holding one file ``name`` with ``text``, landed at NOW."""
    with tempfile.TemporaryDirectory(prefix="tidemark-landing-") as folder:
        (Path(folder) / name).write_bytes(text)
        os.utime(Path(folder) / name, (NOW.timestamp(), NOW.timestamp()))
        yield folder


def file_rows(spark, text: bytes, cfg=None, parsed=True, name="f.json"):
    """The rows the file source's reader gives a landed file ``name`` (JSON lines, or CSV
    as the pipeline says) holding ``text``, landed at NOW: its raw records, or
    (``parsed``) their parse."""
    cfg = cfg or config()
    with landed(text, name) as folder:
        csv = cfg.source.format == "csv"
        raw = csv_lines(spark.read, folder) if csv else json_lines(spark.read, cfg, folder)
        return (parse_records(raw, cfg, NOW) if parsed else raw).collect()


def parse_file(spark, lines, cfg=None):
    """The lines as one landed JSON file, as the file source reads it."""
    return file_rows(spark, file_text(lines), cfg)


@pytest.fixture(params=["record", "file"])
def read(request):
    """Both ways a JSON record reaches the parse: alone (Kafka), or as a line of a file."""
    return parse if request.param == "record" else parse_file


Read = Callable[[SparkSession, list[str], PipelineConfig | None], list[Row]]


@pytest.fixture(scope="module")
def alone(spark) -> Callable[..., Row]:
    """``alone(read, line, among, cfg=None)``: the row ``read`` gives ``line``, from one
    read of all the lines ``among`` (its parametrize table's, under the same config),
    made once per reader and config.

    A Spark job per case was most of this file's time, and a read judges each of its
    lines as it would alone (as the file source's property tests below check)."""
    reads: dict[tuple[Read, tuple[str, ...], str], list[Row]] = {}

    def row_of(read: Read, line: str, among: Iterable[str], cfg: PipelineConfig | None = None) -> Row:
        lines = tuple(dict.fromkeys(among))  # each line once, so that its number finds its row
        key = (read, lines, repr(cfg))  # a config is not hashable; equal ones print alike
        if key not in reads:
            reads[key] = read(spark, list(lines), cfg)
        number = lines.index(line) + 1
        [row] = [row for row in reads[key] if row.source_offset == number]
        assert row.raw == line  # the row found is this case's own
        return row

    return row_of


def reason_of(spark, line, cfg=None, read=parse):
    [row] = read(spark, [line], cfg)
    return row.reason


def test_a_valid_record_is_typed_and_gets_all_three_times(spark, read):
    [row] = read(spark, [record()])
    assert row.reason is None
    assert (row.device_id, row.battery, row.partition) == ("d1", 80.5, 2)
    assert row.event_time == datetime(2026, 1, 1)
    assert row.ingest_time == datetime(2026, 6, 1, 12) and row.processing_time == datetime(2026, 6, 1, 12)
    assert row.source_partition == "2"


def test_a_batch_at_a_new_processing_time_runs_the_code_of_the_one_before(spark):
    # Spark writes timestamp and long literals into its generated code: passed as
    # literals, every batch's processing time and horizon would compile the parse again.
    cfg = config()
    lines = [record(), record(battery="full")]
    later = NOW + timedelta(seconds=1)
    with expressions_compiled(spark):
        parse_records(raw_records(spark, lines), cfg, NOW).collect()
        compiled = classes_compiled(spark)

        rows = parse_records(raw_records(spark, lines), cfg, later).collect()

        assert [(row.reason, row.processing_time) for row in rows] == [
            (None, datetime(2026, 6, 1, 12, 0, 1)),
            ("wrong_type", datetime(2026, 6, 1, 12, 0, 1)),
        ]
        assert classes_compiled(spark) == compiled


def test_event_ids_are_deterministic_and_distinct_per_coordinate(spark):
    first = [r.event_id for r in parse(spark, [record(), record()])]
    again = [r.event_id for r in parse(spark, [record(), record()])]
    assert first == again and len(set(first)) == 2


@pytest.mark.parametrize(
    ("form", "lines", "line_numbers"),
    [
        ("json", [record(), record()], [1, 2]),
        ("csv", ["device_id,ts,region,battery,speed,partition", f"d1,{T0},north,80.5,3.0,2"], [2]),
    ],
)
def test_a_landed_records_event_id_names_its_file_as_the_files_path_spells_it(
    spark, form, lines, line_numbers
):
    cfg = config(source={"kind": "files", "path": "landing/t", "format": form})
    rows = file_rows(spark, file_text(lines), cfg, name=f"a day%20ü.{form}")
    spelled = f"a%20day%2520ü.{form}"  # the name as the last segment of source_file
    assert [r.event_id for r in rows] == [f"{spelled}:{line}" for line in line_numbers]
    assert all(r.source_file.endswith(f"/{spelled}") for r in rows)


def test_kafka_partition_wins_over_the_payload_partition_column(spark):
    [row] = parse(spark, [record(partition=9)], source_partition="0")
    assert row.source_partition == "0"


BAD_RECORDS = [
    ("", "empty_record"),
    ("   ", "empty_record"),
    ('{"device_id": "d1", "ts": ', "malformed_record"),
    ("[1, 2]", "malformed_record"),
    (record(device_id=...), "missing_key"),
    (record(region=None), "missing_key"),
    (record(ts=...), "missing_timestamp"),
    (record(ts="yesterday"), "unparseable_timestamp"),
    (record(ts=10**18), "timestamp_out_of_range"),
    (record(ts=int(NOW.timestamp() * 1000) + 3_600_001), "future_timestamp"),
    (record(battery="full"), "wrong_type"),
    (record(partition="two"), "wrong_type"),
    (record(partition=...), "missing_partition"),
]


@pytest.mark.parametrize(("line", "reason"), BAD_RECORDS)
def test_each_bad_record_is_rejected_with_its_reason(alone, read, line, reason):
    assert alone(read, line, [text for text, _ in BAD_RECORDS]).reason == reason


def session_config():
    schema = {**config().schema, "gap": "long"}
    return config(schema=schema, window={"type": "session", "gap_column": "gap", "max_gap": "30m"}, gold=None)


SESSION_GAPS = [
    (60_000, None),
    (1_800_000, None),
    (..., "gap_missing"),
    (None, "gap_missing"),
    (0, "gap_not_positive"),
    (-60_000, "gap_not_positive"),
    (1_800_001, "gap_above_max"),
    ("long", "wrong_type"),
]


@pytest.mark.parametrize(("gap", "reason"), SESSION_GAPS)
def test_a_session_records_gap_must_be_present_positive_and_at_most_max_gap(alone, read, gap, reason):
    row = alone(read, record(gap=gap), [record(gap=other) for other, _ in SESSION_GAPS], session_config())
    assert row.reason == reason


def test_a_gap_reject_names_the_gap_and_the_bound(spark):
    [row] = parse(spark, [record(gap=1_800_001)], session_config())
    assert row.detail == "gap: 1800001 is above window.max_gap (1800000 ms)"


NOT_ONE_OBJECT = [
    record() + record(device_id="d2"),  # two records on one line: the second would vanish
    record() + " " + record(device_id="d2"),
    record() + "," + record(device_id="d2"),
    record() + " trailing words",
    record() + "}",
    record() + "]",  # closes the array bronze wraps a line in
    record() + "]," + record(device_id="d2"),
    "[" + record() + "]",
    "\ufeff" + record(),
]


@pytest.mark.parametrize("line", NOT_ONE_OBJECT)
def test_anything_but_one_json_object_on_a_line_is_malformed(alone, read, line):
    """Found by fuzzing: Spark's JSON reader ignores whatever follows the first value."""
    assert alone(read, line, NOT_ONE_OBJECT).reason == "malformed_record"


VALUES_BY_TEXT = [
    (record(battery="12.5"), None, 12.5),  # a number in quotes casts, as its text does
    (record(battery="NaN"), None, float("nan")),
    (record()[:-1] + ', "battery": "empty"}', "wrong_type", None),  # the last of two wins
    (record(battery="empty")[:-1] + ', "battery": 7}', None, 7.0),
    (record()[:-1] + ', "battery": 1e400}', "wrong_type", None),  # beyond a double
]


@pytest.mark.parametrize(("line", "reason", "battery"), VALUES_BY_TEXT)
def test_a_value_is_judged_by_its_text(alone, read, line, reason, battery):
    """Found while trying a typed fast path: Spark's JSON reader converts some values
    differently from a cast of their text (it keeps a duplicate key's earlier value
    when the later does not convert, reads 1e400 as infinity). The text decides."""
    row = alone(read, line, [text for text, *_ in VALUES_BY_TEXT])
    assert (row.reason, repr(row.battery)) == (reason, repr(battery))  # repr: NaN equals NaN


LINES_THE_SCAN_DOES_NOT_VOUCH_FOR = [
    record(device_id="d}1"),  # a brace inside a string: not the object's last character
    record(region="nörth}"),
    record(device_id={"nested": 1}),  # an object value: its text, as a string field reads it
    record(battery="Infinity"),  # read as infinite at the type, so read again as text
]


@pytest.mark.parametrize("line", LINES_THE_SCAN_DOES_NOT_VOUCH_FOR)
def test_a_line_the_byte_scan_does_not_vouch_for_is_read_as_text_with_the_same_answer(alone, read, line):
    """A line whose only ``}`` is not its last character, or whose typed read gave
    an infinity, is parsed again as text; its values must be those of its text."""
    row = alone(read, line, LINES_THE_SCAN_DOES_NOT_VOUCH_FOR)
    payload = json.loads(line)
    expected_device = payload["device_id"] if isinstance(payload["device_id"], str) else '{"nested":1}'
    assert (row.reason, row.device_id, row.region) == (None, expected_device, payload["region"])
    assert row.battery == float(payload["battery"])


def test_a_record_with_multibyte_characters_is_read_at_its_types(spark):
    [row] = parse(spark, [record(region="süd-øst", device_id="车辆-7", battery=12)])
    assert (row.reason, row.region, row.device_id, row.battery) == (None, "süd-øst", "车辆-7", 12.0)


def test_one_json_object_with_brackets_in_its_values_is_valid(spark):
    [row] = parse(spark, [record(region="[north]", device_id="]{x}[")])
    assert (row.reason, row.region, row.device_id) == (None, "[north]", "]{x}[")


def test_a_timestamp_just_inside_the_future_skew_is_accepted(spark, read):
    assert reason_of(spark, record(ts=int(NOW.timestamp() * 1000) + 3_600_000), read=read) is None


WHOLE_EPOCH_TIMES = [
    ("epoch_millis", 10**18, "timestamp_out_of_range", "ts: 1000000000000000000 is outside years 1-9999"),
    ("epoch_seconds", 10**17, "timestamp_out_of_range", "ts: 100000000000000000 is outside years 1-9999"),
    (
        "epoch_millis",
        -(10**15),
        "timestamp_out_of_range",
        "ts: -1000000000000000 is outside years 1-9999",
    ),
    (
        "epoch_seconds",
        int(NOW.timestamp()) + 3_601,
        "future_timestamp",
        f"ts: {int(NOW.timestamp()) + 3_601} is beyond the allowed future skew",
    ),
    ("epoch_seconds", T0 // 1000, None, None),
]


@pytest.mark.parametrize(("fmt", "value", "reason", "detail"), WHOLE_EPOCH_TIMES)
def test_a_whole_epoch_time_is_judged_and_shown_as_its_text(alone, read, fmt, value, reason, detail):
    """A whole epoch number is read at its type where it passes every check (the
    fast path); one that fails a check (beyond the range once scaled, in the
    future) is judged again from its text, which its detail shows."""
    same_format = [record(ts=ts) for form, ts, *_ in WHOLE_EPOCH_TIMES if form == fmt]
    row = alone(read, record(ts=value), same_format, text_ts_config(fmt, kind="long"))
    assert (row.reason, row.detail) == (reason, detail)
    if reason is None:
        assert row.event_time == datetime(2026, 1, 1)


def test_reject_detail_names_the_offending_field_and_value(spark, read):
    [row] = read(spark, [record(battery="full")])
    assert row.detail == "battery: full is not a double"


@pytest.mark.parametrize(
    ("fmt", "timezone", "value", "expected"),
    [
        ("epoch_millis", "UTC", T0 + 1, datetime(2026, 1, 1, 0, 0, 0, 1000)),
        ("epoch_seconds", "UTC", T0 // 1000, datetime(2026, 1, 1)),
        ("epoch_seconds", "UTC", T0 / 1000 + 0.25, datetime(2026, 1, 1, 0, 0, 0, 250000)),
        ("epoch_millis", "UTC", -1, datetime(1969, 12, 31, 23, 59, 59, 999000)),
        ("iso8601", "UTC", "2026-01-01T00:00:00Z", datetime(2026, 1, 1)),
        ("iso8601", "UTC", "2026-01-01T02:00:00.5+02:00", datetime(2026, 1, 1, 0, 0, 0, 500000)),
        ("iso8601", "Europe/Paris", "2026-01-01T01:00:00", datetime(2026, 1, 1)),
        ("iso8601", "Europe/Paris", "2025-07-01T02:00:00", datetime(2025, 7, 1)),
        ("yyyy-MM-dd HH:mm:ss", "UTC", "2026-01-01 00:00:00", datetime(2026, 1, 1)),
        ("yyyy-MM-dd HH:mm:ss", "America/New_York", "2025-12-31 19:00:00", datetime(2026, 1, 1)),
        ("dd/MM/yyyy HH:mm:ss XXX", "America/New_York", "01/01/2026 01:00:00 +01:00", datetime(2026, 1, 1)),
    ],
)
def test_every_timestamp_format_gives_the_utc_event_time(spark, fmt, timezone, value, expected):
    kind = "long" if fmt == "epoch_millis" else ("double" if fmt == "epoch_seconds" else "string")
    [row] = parse(spark, [record(ts=value)], text_ts_config(fmt, timezone, kind))
    assert row.reason is None, row.detail
    assert row.event_time == expected


def text_ts_config(fmt: str, timezone: str = "UTC", kind: str = "string"):
    schema = {
        "device_id": "string",
        "ts": kind,
        "region": "string",
        "battery": "double",
        "speed": "double",
        "partition": "int",
    }
    return config(schema=schema, event_time={"column": "ts", "format": fmt, "timezone": timezone})


EPOCH_FRACTIONS = [  # found by fuzzing: decimal(38,6) rounded the 7th decimal up into the next millisecond
    ("epoch_seconds", "1767225600.1239996", T0 + 123),
    ("epoch_seconds", "-0.000000228", -1),
    ("epoch_millis", "1767225600000.9999999", T0),
    ("epoch_millis", "-0.0000001", -1),
    ("epoch_millis", "-1.5", -2),  # floored, where a conversion to a long truncates
    ("epoch_millis", " 1767225600000 ", T0),  # a whole number read as a long
    ("epoch_seconds", "1767225600", T0),
    ("epoch_seconds", "-1", -1_000),
]


@pytest.mark.parametrize(("fmt", "value", "expected_ms"), EPOCH_FRACTIONS)
def test_epoch_fractions_are_floored_to_the_millisecond_never_rounded_up(alone, fmt, value, expected_ms):
    same_format = [record(ts=ts) for form, ts, _ in EPOCH_FRACTIONS if form == fmt]
    row = alone(parse, record(ts=value), same_format, text_ts_config(fmt))
    assert row.reason is None, row.detail
    assert row.event_time == datetime(1970, 1, 1) + timedelta(milliseconds=expected_ms)


@pytest.mark.parametrize(
    ("timezone", "value", "expected"),
    [  # found by fuzzing: each was read as a different instant
        ("Europe/Paris", "2026-01-01", datetime(2025, 12, 31, 23)),  # "-01" is no zone offset
        ("Europe/Paris", "2026-01-01 00:00:00+00:00", datetime(2026, 1, 1)),
        ("Pacific/Kiritimati", "2026-01-01T00:00:00-12:00", datetime(2026, 1, 1, 12)),
        ("America/New_York", "2025-03-09T02:30:00", datetime(2025, 3, 9, 7, 30)),  # in the DST gap
    ],
)
def test_iso8601_zones_are_applied_once(spark, timezone, value, expected):
    [row] = parse(spark, [record(ts=value)], text_ts_config("iso8601", timezone))
    assert row.reason is None, row.detail
    assert row.event_time == expected


UNPARSEABLE_ISO8601 = [
    "10:00:00",  # found by fuzzing: Spark dates a bare time today, so a replay moves it
    "T10:00:00Z",
    "2026-01-01T10:00:00 UTC",  # found by fuzzing: zone names were applied twice
    "2026-01-01T10:00:00Europe/Paris",
    "2026",
    "2026-02-29T00:00:00Z",
]


@pytest.mark.parametrize("value", UNPARSEABLE_ISO8601)
def test_iso8601_needs_a_date_and_at_most_an_offset(alone, value):
    lines = [record(ts=ts) for ts in UNPARSEABLE_ISO8601]
    for timezone in ("UTC", "Europe/Paris"):
        row = alone(parse, record(ts=value), lines, text_ts_config("iso8601", timezone))
        assert row.reason == "unparseable_timestamp"


def test_a_pattern_that_does_not_match_is_unparseable(spark):
    schema = {
        "device_id": "string",
        "ts": "string",
        "region": "string",
        "battery": "double",
        "speed": "double",
        "partition": "int",
    }
    cfg = config(schema=schema, event_time={"column": "ts", "format": "yyyy-MM-dd HH:mm:ss"})
    assert reason_of(spark, record(ts="2026-01-01T00:00:00Z"), cfg) == "unparseable_timestamp"


def test_punctuated_markers_need_no_key_and_stay_in_bronze(spark):
    schema = {
        "device_id": "string",
        "ts": "long",
        "region": "string",
        "battery": "double",
        "speed": "double",
        "partition": "int",
        "wm": "boolean",
    }
    cfg = config(schema=schema, watermark={"strategy": "punctuated", "marker_column": "wm"})
    marker = json.dumps({"ts": T0, "partition": 1, "wm": True})
    [row] = parse(spark, [marker], cfg)
    assert row.reason is None and row.wm is True


def test_csv_records_are_parsed_by_position_and_wrong_field_counts_are_malformed(spark):
    cfg = config(source={"kind": "files", "path": "landing/t", "format": "csv"})
    header = "device_id,ts,region,battery,speed,partition"
    rows = [
        (f"d1,{T0},north,80.5,3.0,2", None, "/l/f.csv", "f.csv", 2, NOW, header),
        ("d1,1,north,80.5,3.0,2,extra", None, "/l/f.csv", "f.csv", 3, NOW, header),
        (
            f"d1,{T0},north,80.5,3.0,2",
            None,
            "/l/g.csv",
            "g.csv",
            2,
            NOW,
            "id,time,where,battery,speed,partition",
        ),
    ]
    raw = spark.createDataFrame(
        rows,
        RAW_SCHEMA,
    )
    parsed = parse_records(raw, cfg, NOW).orderBy("source_file", "source_offset").collect()
    assert [r.reason for r in parsed] == [None, "malformed_record", "csv_header_mismatch"]
    assert (parsed[0].device_id, parsed[0].battery, parsed[0].partition) == ("d1", 80.5, 2)


def test_csv_quotes_are_rfc_4180_as_python_writes_them(spark):
    """Found by fuzzing: Spark's default escape (a backslash) kept doubled quotes."""
    cfg = config(source={"kind": "files", "path": "landing/t", "format": "csv"})
    header = "device_id,ts,region,battery,speed,partition"
    values = ['say "hi"', T0, '"', 1.5, 2.5, 3]
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow(values)
    raw = spark.createDataFrame([(out.getvalue(), None, "/l/f.csv", "f.csv", 2, NOW, header)], RAW_SCHEMA)
    [row] = parse_records(raw, cfg, NOW).collect()
    assert (row.reason, row.device_id, row.region) == (None, 'say "hi"', '"')


def test_a_csv_field_that_begins_with_a_byte_order_mark_keeps_it(spark):
    """Found by fuzzing: Spark's CSV parser took it for an encoding marker and the
    record lost its device_id (rejected as missing_key)."""
    cfg = config(source={"kind": "files", "path": "landing/t", "format": "csv"})
    header = "device_id,ts,region,battery,speed,partition"
    lines = [f"\ufeff,{T0},north,1.5,2.5,3", f"\ufeffd1,{T0},north,1.5,2.5,3"]
    raw = spark.createDataFrame(
        [(line, None, "/l/f.csv", "f.csv", 2, NOW, header) for line in lines], RAW_SCHEMA
    )
    parsed = parse_records(raw, cfg, NOW).collect()
    assert [(row.reason, row.device_id) for row in parsed] == [(None, "\ufeff"), (None, "\ufeffd1")]


def test_split_lines_numbers_lines_and_ignores_only_the_trailing_newline(spark):
    files = spark.createDataFrame(
        [("a\r\n\nb\n", "/l/one.json", "one.json", NOW), ("h\nx", "/l/two.csv", "two.csv", NOW)],
        "value string, source_file string, source_name string, ingest_time timestamp",
    )
    rows = split_lines(files.where("source_file like '%json'"), has_header=False).collect()
    assert [(r.raw, r.source_offset) for r in rows] == [("a", 1), ("", 2), ("b", 3)]
    with_header = split_lines(files.where("source_file like '%csv'"), has_header=True).collect()
    assert [(r.raw, r.source_offset, r.header) for r in with_header] == [("x", 2, "h")]


# The property tests' one config: the parse's columns are built once per config, as a
# stream builds them once for all its batches, not again on every example.
TELEMETRY = config()

# Lines for the file read's property tests. One object a line, each in its own way:
ONE_OBJECT_LINES = (
    record(),
    record(device_id="d2", battery=12),
    record(battery="full"),
    record(battery="12.5"),
    record()[:-1] + ', "battery": 1e400}',
    record()[:-1] + ', "battery": "empty"}',
    record(partition=...),
    record(battery=None),
    record(ts=...),
    record(ts="1767225600000"),
    record(ts=10**18),
    record(ts=int(NOW.timestamp() * 1000) + 3_600_001),
    # numbers where the schema has text: Spark's parser gives a string field the
    # number's text (1.50, 1e2 written as the parser writes them)
    record(device_id=115404, region=1.50),
    record()[:-1] + ', "region": 1e2}',
    "{}",
)
# and lines the byte scan does not vouch for, including ones that would misalign a
# parse of the file's lines as one array if it let them in.
OTHER_LINES = (
    record(device_id="d}1"),
    record() + record(device_id="d2"),
    record() + ", " + record(device_id="d2"),
    '{"device_id": "d1", "ts": [1',
    '2], "region": "north", "battery": 1, "speed": 1, "partition": 1}',
    '{"device_id": "d3", "region": "x}',
    record() + "\r" + record(device_id="d2"),
    # joined by commas, an array of two objects with one `}` each; the first alone
    # is an object with trailing text
    record() + ', {"device_id": "d2"',
    '"region": "south"}',
    "",
    "not json",
    "null",
)


def outcome(rows):
    return [(r.raw, r.reason, r.detail, r.device_id, repr(r.battery), r.event_time, r.event_id) for r in rows]


@settings(max_examples=10, deadline=None)
@given(st.lists(st.sampled_from(ONE_OBJECT_LINES), min_size=1, max_size=12))
def test_a_files_lines_of_one_object_each_are_judged_as_each_is_alone(spark, lines):
    """The file source reads a JSON file's lines as it splits the file; every line
    gets the values, the verdict and the coordinate it gets alone."""
    assert outcome(parse_file(spark, lines, TELEMETRY)) == outcome(parse(spark, lines, TELEMETRY))


@settings(max_examples=10, deadline=None)
@given(st.lists(st.sampled_from(ONE_OBJECT_LINES + OTHER_LINES), min_size=1, max_size=12))
def test_any_file_judges_every_line_as_it_would_alone(spark, lines):
    """Whatever else a file holds, each of its lines is judged as it is alone."""
    assert outcome(parse_file(spark, lines, TELEMETRY)) == outcome(parse(spark, lines, TELEMETRY))


# Text a line may hold (no newline, which ends it): JSON's punctuation, a record's
# pieces, and characters the byte scan and the byte parser must not be fooled by.
LINE_TEXT = st.lists(
    st.sampled_from(
        [
            *("{", "}", "[", "]", '"', ":", ",", " ", "\r", "\\", "1", "x", "é", "\ufeff", "\x00", "€", "𝄞"),
            *(record(), '"device_id": "d1"', '"battery": 1e400', '"ts": 1767225600000'),
        ]
    ),
    max_size=8,
).map("".join)


@settings(max_examples=25, deadline=None)
@given(st.lists(LINE_TEXT.filter(lambda line: not line.endswith("\r")), min_size=1, max_size=6))
def test_any_text_a_line_holds_is_judged_as_it_is_alone(spark, lines):
    """The reader's own byte parse and byte scan give every line what Spark's
    ``from_json`` and the scan of a record alone give it (a line's closing CR is its
    line end, hence none here)."""
    assert outcome(parse_file(spark, lines, TELEMETRY)) == outcome(parse(spark, lines, TELEMETRY))


@settings(max_examples=25, deadline=None)
@given(st.lists(LINE_TEXT, min_size=1, max_size=6))
def test_the_readers_byte_scan_is_surely_one_object(spark, lines):
    """One rule in two places: the scan the reader makes as it splits a file, and
    :func:`surely_one_object` over the line, for a record that arrives alone."""
    with landed(file_text(lines)) as folder:
        raw = json_lines(spark.read, TELEMETRY, folder)
        rows = raw.select("one_object", surely_one_object(F.col("raw")).alias("scan")).collect()
    assert [row.one_object for row in rows] == [row.scan for row in rows]


def test_bytes_that_are_not_utf8_or_begin_with_a_signature_are_read_as_from_json_reads_them(spark, tmp_path):
    """Jackson reads bytes by their encoding's signature (a byte-order mark, zero
    bytes) and refuses bad UTF-8; ``from_json``'s character reader does neither. The
    reader's rows carry what ``from_json`` makes of the text source's lines."""
    text = b"".join(
        line + b"\n"
        for line in [
            b'{"device_id": "d\xff1", "ts": 5}',  # a byte no UTF-8 character begins with
            b'\xef\xbb\xbf{"device_id": "d2", "ts": 5}',  # a byte-order mark
            b'\x00{"device_id": "d3"}',
            b'{"device_id": "d4", "ts": 5}',
        ]
    )
    (tmp_path / "f.json").write_bytes(text)
    cfg = config()
    read = [(row.raw, row.typed) for row in json_lines(spark.read, cfg, str(tmp_path)).collect()]
    alone = spark.read.text(str(tmp_path)).select(
        F.col("value"), F.from_json("value", typed_read_schema(cfg), {"mode": "PERMISSIVE"}).alias("typed")
    )
    assert read == [(row.value, row.typed) for row in alone.collect()]
    assert [typed.device_id for _, typed in read] == ["d\ufffd1", None, None, "d4"]


def test_the_reader_numbers_lines_and_takes_off_each_lines_end(spark):
    text = b'{"a": 1}\r\n\n{"b": 2}\n\r\n{"c": 3}'
    rows = file_rows(spark, text, parsed=False)
    assert [(row.raw, row.source_offset, row.one_object) for row in rows] == [
        ('{"a": 1}', 1, True),
        ("", 2, False),
        ('{"b": 2}', 3, True),
        ("", 4, False),
        ('{"c": 3}', 5, True),
    ]
    assert [row.raw for row in file_rows(spark, b"\n", parsed=False)] == [""]
    assert file_rows(spark, b"", parsed=False) == []


def test_the_reader_reads_lines_across_its_buffers_and_longer_than_they_are(spark):
    """The reader takes a file 64 KiB at a time: lines that straddle two reads, and
    one longer than a read, come out whole and in order."""
    long_line = record(device_id="x" * 150_000)
    lines = [record(device_id=f"d{i}", ts=T0 + i) for i in range(3_000)]
    lines.insert(1_234, long_line)
    rows = file_rows(spark, file_text(lines)[:-1], parsed=False)  # the last line has no newline
    assert [(row.raw, row.source_offset) for row in rows] == [(line, i + 1) for i, line in enumerate(lines)]
    assert rows[1_234].typed.device_id == "x" * 150_000
    assert [row.typed.ts for row in rows[-2:]] == [T0 + 2_998, T0 + 2_999]


def test_the_file_source_hands_the_parse_each_lines_typed_read(spark, tmp_path):
    """Guards the cheap path: the landing zone's JSON lines reach the parse typed and
    scanned, so no line is read by ``from_json`` again (a record alone is: once more)."""
    (tmp_path / "lf.json").write_text(record() + "\n" + record(device_id="d2") + "\n")
    (tmp_path / "crlf.json").write_text(record() + "\r\n" + record(device_id="d2") + "\r\n")
    cfg = config()
    raw = json_lines(spark.read, cfg, str(tmp_path))
    lines = raw.orderBy("source_file", "source_offset").collect()
    typed = [(r.source_file.rsplit("/", 1)[1], r.raw, r.one_object, r.typed.device_id) for r in lines]
    assert typed == [
        ("crlf.json", record(), True, "d1"),
        ("crlf.json", record(device_id="d2"), True, "d2"),
        ("lf.json", record(), True, "d1"),
        ("lf.json", record(device_id="d2"), True, "d2"),
    ]

    def parses(frame):
        return (
            parse_records(frame, cfg, NOW)
            ._jdf.queryExecution()
            .optimizedPlan()
            .toString()
            .count("from_json(")
        )

    assert parses(raw) + 1 == parses(raw_records(spark, [record()]))


def test_a_later_stream_start_builds_no_column_of_the_file_source_again(spark, tmp_path, monkeypatch):
    """Guards the start-up path: the landing zone's columns are built on a pipeline's
    first stream start in a process. A later start makes only its DataFrame
    operations' JVM calls: 63, against 997 when every column was built again."""
    cfg = config()
    read_landing(spark, cfg, str(tmp_path))
    calls = []
    send = ClientServerConnection.send_command
    this_thread = threading.current_thread()

    def counted(self, command):
        # Only this thread's: py4j threads that earlier tests left running call too.
        if threading.current_thread() is this_thread:
            calls.append(command.split("\n", 1)[0])
        return send(self, command)

    monkeypatch.setattr(ClientServerConnection, "send_command", counted)
    read_landing(spark, cfg, str(tmp_path))
    assert 0 < len(calls) < 100, Counter(calls)


def test_the_text_path_scans_no_line_the_fast_path_took(spark, tmp_path):
    """Guards bronze's hot path: the text path's test that a line is one value (a
    scan for a `]`, then a read as an object's member) sits behind the slow path's
    guard. A fast record has no elements, and the null their size gives does not stop
    an AND: unguarded, every line of every file was scanned (2-3 % of bronze's time)."""
    cfg = config()
    (tmp_path / "f.json").write_text(record() + "\n")
    raw = json_lines(spark.read, cfg, str(tmp_path))
    plan = parse_records(raw, cfg, NOW)._jdf.queryExecution().optimizedPlan().toString()
    scans = re.findall(r"Contains\(raw#\d+, \]\)", plan)
    guarded = re.findall(
        r"CASE WHEN \(NOT fast#\d+ AND \(\(size\(elements#\d+, false\) = 1\) AND \(NOT Contains\(raw#", plan
    )
    assert len(scans) == len(guarded) == 1


@pytest.mark.parametrize("compiled", [False, True], ids=["interpreted", "compiled"])
@settings(max_examples=15, deadline=None)
@given(st.lists(LINE_TEXT, min_size=1, max_size=6))
def test_compiled_from_json_reads_any_text_as_from_json_reads_it(spark, compiled, lines):
    """The text path's two reads (a bracketed line as an array of text records, a
    line as an object's member) give what Spark's ``from_json`` gives, nulls and
    corrupt records included, in interpreted and in compiled code."""
    reads = [
        (
            F.concat(F.lit("["), F.col("line"), F.lit("]")),
            "ARRAY<STRUCT<device_id STRING, ts STRING>>",
            PERMISSIVE,
        ),
        (F.concat(F.lit('{"r":'), F.col("line"), F.lit("}")), "r STRUCT<>", {}),
    ]
    frame = spark.createDataFrame([(line,) for line in [*lines, None]], "line string")

    def both_reads(from_json):
        return F.struct(*(from_json(text, schema, options) for text, schema, options in reads))

    with expressions_compiled(spark) if compiled else contextlib.nullcontext():
        pairs = frame.select(
            both_reads(F.from_json).alias("spark"), both_reads(compiled_from_json).alias("ours")
        )
        rows = pairs.collect()
    assert [row.ours for row in rows] == [row.spark for row in rows]


def test_the_text_paths_reads_leave_every_projection_of_the_parse_compiled(spark, tmp_path):
    """Guards bronze's hot path: Spark runs ``from_json`` interpreted only, and a
    projection holding it is left out of whole-stage code generation, so every row of
    every batch was copied through two projections of their own (7-8 % of bronze)."""
    cfg = config()
    (tmp_path / "f.json").write_text(record() + "\n" + record(battery="full") + "\n")
    raw = json_lines(spark.read, cfg, str(tmp_path))
    with expressions_compiled(spark):
        parsed = parse_records(raw, cfg, NOW)
        assert [row.reason for row in parsed.collect()] == [None, "wrong_type"]
        plan = parsed._jdf.queryExecution().executedPlan().toString()
    projections = re.findall(r"^[ :+-]*(\*\(\d+\) )?Project \[", plan, re.MULTILINE)
    assert projections
    assert [compiled for compiled in projections if not compiled] == []


def test_a_zone_unknown_to_sparks_java_runtime_is_refused_before_any_table(spark, tmp_path):
    """Python's tz database can be newer than Java's: such a zone would fail every batch."""
    cfg = text_ts_config("iso8601", "Europe/Paris")
    unknown = replace(cfg, event_time=replace(cfg.event_time, timezone="Mars/Olympus"))
    registry = TableRegistry(unknown, str(tmp_path))
    context = JobContext("bronze", unknown, registry, "available-now", 1_000, str(tmp_path / "checkpoint"))
    with pytest.raises(ConfigError, match=r"event_time\.timezone: .Mars/Olympus. is unknown"):
        bronze.run(spark, context)
    assert list(tmp_path.iterdir()) == []
