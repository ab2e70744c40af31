"""Bad input fuzzing through the real bronze job: hypothesis mixes malformed records
(broken JSON and CSV, wrong types, huge fields, control characters and odd unicode,
timestamps at the ends of the timestamp type, beyond ``long``, negative, zone offsets
from -12:00 to +14:00 and DST gaps, schema drift) with good ones, lands them as files
and runs bronze available-now in the session's Spark.

Nothing may crash, be dropped or be doubled: every input line is a bronze row or an
``ops.rejects`` row, exactly once, matched by its file and line number; a reject keeps
its raw text and carries the reason an independent oracle expects; a good record's
payload and event time are the oracle's. The oracle below is the pipeline contract
(README "Bronze ingest") written again in plain Python (``json``, ``csv``,
``zoneinfo``), not a call into the code under test.

One Spark run per example and two examples per pipeline, each carrying every
defect among many records, keep this to about two minutes.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import os
import re
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from spark_jobs.config import PipelineConfig, parse_pipeline
from spark_jobs.jobs import bronze
from spark_jobs.jobs.common import JobContext
from spark_jobs.tables import TableRegistry

pytestmark = [pytest.mark.spark]

# ---------------------------------------------------------------- the oracle's own constants
EPOCH = datetime(1970, 1, 1)
MS = timedelta(milliseconds=1)


def naive_ms(moment: datetime) -> int:
    """Epoch milliseconds of a naive UTC datetime, floored (exact for year 1 too)."""
    return (moment - EPOCH) // MS


MIN_MS = naive_ms(datetime(1, 1, 1))
MAX_MS = naive_ms(datetime(9999, 12, 31, 23, 59, 59, 999_000))
INT_RANGE = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}
SKEW_MS = 3_600_000
STARTED_MS = naive_ms(datetime.now(UTC).replace(tzinfo=None))
# A good record is at most STARTED_MS; a future one lies a day past the skew, so
# the batch's own processing time (a little after STARTED_MS) cannot blur the two.
FUTURE_MS = STARTED_MS + SKEW_MS + 86_400_000
FIELDS = ("device_id", "ts", "region", "battery", "speed", "partition")
KEY = ("region", "device_id")
INTEGER = re.compile(r"[+-]?[0-9]+")
NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
ISO_8601 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})"
    r"(?:[T ]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,9}))?(Z|([+-])([0-9]{2})(?::?([0-9]{2}))?)?)?"
)
# Spark's JSON parser (Jackson) refuses documents nested deeper than this.
MAX_DEPTH = 999
PATTERN = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2}) ([0-9]{2}):([0-9]{2}):([0-9]{2})")


@dataclass(frozen=True)
class Variant:
    name: str
    file_format: str
    ts_type: str
    time_format: str
    timezones: tuple[str, ...] = ("UTC",)

    def config(self, landing: Path, timezone: str) -> PipelineConfig:
        document = {
            # One table set per schema: examples of several variants share it.
            "pipeline": f"fuzz_{self.ts_type}",
            "source": {"kind": "files", "path": str(landing), "format": self.file_format},
            "schema": {
                "device_id": "string",
                "ts": self.ts_type,
                "region": "string",
                "battery": "double",
                "speed": "double",
                "partition": "int",
            },
            "event_time": {"column": "ts", "format": self.time_format, "timezone": timezone},
            "partition_column": "partition",
            "key": list(KEY),
            "watermark": {"strategy": "bounded", "max_out_of_orderness": "5s"},
            "window": {"type": "tumbling", "size": "1m"},
        }
        return parse_pipeline(document)


VARIANTS = [
    Variant("json_millis", "json", "long", "epoch_millis"),
    Variant("json_seconds", "json", "double", "epoch_seconds"),
    Variant(
        "json_iso",
        "json",
        "string",
        "iso8601",
        ("UTC", "Pacific/Kiritimati", "Etc/GMT+12", "America/New_York", "Asia/Kathmandu"),
    ),
    Variant(
        "csv_pattern",
        "csv",
        "string",
        "yyyy-MM-dd HH:mm:ss",
        ("America/New_York", "Europe/London", "Australia/Lord_Howe", "Pacific/Chatham"),
    ),
    Variant("csv_millis", "csv", "long", "epoch_millis"),
]


# ---------------------------------------------------------------- the oracle
class Bad(Exception):
    """A record the contract rejects, with the reason it must get."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


@dataclass
class Verdict:
    reason: str | None
    payload: dict[str, Any] | None = None
    event_ms: int | None = None


def depth(document: Any) -> int:
    """How deeply objects and arrays nest (a flat object is 1)."""
    deepest, stack = 0, [(document, 1)]
    while stack:
        value, level = stack.pop()
        if isinstance(value, dict | list):
            deepest = max(deepest, level)
            stack.extend(
                (child, level + 1) for child in (value.values() if isinstance(value, dict) else value)
            )
    return deepest


def json_fields(raw: str) -> dict[str, str | None]:
    """Each field as text (a JSON string's content, any other value's JSON text), or
    Bad: strict JSON, one object per line, nothing after it."""

    def no_constants(name: str) -> None:
        raise ValueError(name)

    try:
        document = json.loads(raw, parse_constant=no_constants)
    except (ValueError, RecursionError):
        raise Bad("malformed_record") from None
    if not isinstance(document, dict) or depth(document) > MAX_DEPTH:
        raise Bad("malformed_record")

    def text(value: Any) -> str | None:
        if value is None or isinstance(value, str):
            return value
        return json.dumps(value) if not isinstance(value, float) else repr(value)

    return {name: text(document.get(name)) for name in FIELDS}


def csv_fields(raw: str) -> dict[str, str | None]:
    """RFC 4180 fields by position; an empty field is null."""
    try:
        rows = list(csv.reader([raw], strict=True))
    except csv.Error:
        raise Bad("malformed_record") from None
    if len(rows) != 1 or len(rows[0]) != len(FIELDS):
        raise Bad("malformed_record")
    return {name: value or None for name, value in zip(FIELDS, rows[0], strict=True)}


def typed(text: str, kind: str) -> Any:
    """Spark's try_cast on the values the generators write; Bad when it fails."""
    if kind == "string":
        return text
    stripped = text.strip(" \t")
    if kind in INT_RANGE:
        low, high = INT_RANGE[kind]
        if not INTEGER.fullmatch(stripped) or not low <= int(stripped) <= high:
            raise Bad("wrong_type")
        return int(stripped)
    if not NUMBER.fullmatch(stripped):
        raise Bad("wrong_type")
    return float(stripped)


def zone_offset(local: datetime, timezone: str) -> timedelta:
    """The zone's offset at a wall-clock time: in a DST gap or overlap, the offset
    in force just before the transition (so 02:30 in a gap is 03:30 after it)."""
    return local.replace(tzinfo=ZoneInfo(timezone)).utcoffset()


def wall_clock(groups: tuple[str | None, ...]) -> tuple[int, datetime]:
    """(epoch ms of the wall-clock time read as UTC, a datetime to look up zone offsets at).
    Year 0 (proleptic Gregorian, a leap year) is a valid date outside the type's range."""
    year, month, day, hour, minute, second = (int(g or 0) for g in groups[:6])
    try:
        moment = datetime(year or 4, month, day, hour, minute, second)
    except ValueError:
        raise Bad("unparseable_timestamp") from None
    if year == 0:  # year 4 less the 1461 days of years 0 to 3
        return naive_ms(moment) - 1461 * 86_400_000, datetime(1, 1, 1)
    return naive_ms(moment), moment


def event_ms(text: str, time_format: str, timezone: str) -> int:
    if time_format in ("epoch_millis", "epoch_seconds"):
        stripped = text.strip(" \t")
        if not NUMBER.fullmatch(stripped):
            raise Bad("unparseable_timestamp")
        scale = 1 if time_format == "epoch_millis" else 1000
        return math.floor(Decimal(stripped) * scale)
    if time_format == "iso8601":
        match = ISO_8601.fullmatch(text)
        if not match:
            raise Bad("unparseable_timestamp")
        millis, local = wall_clock(match.groups())
        fraction = (match.group(7) or "").ljust(3, "0")[:3]
        zone, sign, hours, minutes = match.group(8, 9, 10, 11)
        if zone is None:
            offset = zone_offset(local, timezone)
        elif zone == "Z":
            offset = timedelta(0)
        else:
            if int(hours) > 18 or int(minutes or 0) > 59:
                raise Bad("unparseable_timestamp")
            offset = (1 if sign == "+" else -1) * timedelta(hours=int(hours), minutes=int(minutes or 0))
        return millis + int(fraction) - offset // MS
    match = PATTERN.fullmatch(text)
    if not match:
        raise Bad("unparseable_timestamp")
    millis, local = wall_clock(match.groups())
    return millis - zone_offset(local, timezone) // MS


def judge(raw: str, header: str | None, variant: Variant, timezone: str) -> Verdict:
    """The contract's verdict on one line, reasons checked in README order."""
    try:
        if raw.strip(" ") == "":
            raise Bad("empty_record")
        fields = csv_fields(raw) if variant.file_format == "csv" else json_fields(raw)
        if header is not None and header != ",".join(FIELDS):
            raise Bad("csv_header_mismatch")
        if any(fields[name] is None for name in KEY):
            raise Bad("missing_key")
        if fields["ts"] is None:
            raise Bad("missing_timestamp")
        millis = event_ms(fields["ts"], variant.time_format, timezone)
        if not MIN_MS <= millis <= MAX_MS:
            raise Bad("timestamp_out_of_range")
        assert not STARTED_MS < millis <= FUTURE_MS, f"generator made an ambiguous time {millis}"
        if millis > STARTED_MS:
            raise Bad("future_timestamp")
        kinds = {"battery": "double", "speed": "double", "partition": "int", "ts": variant.ts_type}
        payload = {
            name: None if text is None else typed(text, kinds.get(name, "string"))
            for name, text in fields.items()
        }
        if payload["partition"] is None:
            raise Bad("missing_partition")
        return Verdict(None, payload, millis)
    except Bad as bad:
        return Verdict(bad.reason)


# ---------------------------------------------------------------- the generators
ODD_TEXT = st.text(
    st.characters(codec="utf-8", exclude_characters="\n\r", exclude_categories=("Cs",)), max_size=12
)
NAMES = st.one_of(
    ODD_TEXT,
    st.sampled_from(["north", "Ωμέγα", "東京", "🚀", "e\u0301", "\u202eltr", "a\u0000b", "\u2028", "\ufeff"]),
    st.sampled_from(['say "hi"', '"', "com,ma", "back\\slash", '\\"', "#hash"]),  # CSV quoting
    st.integers(1_000, 100_000).map(lambda n: "x" * n + "é"),  # a huge field
)
# Values Spark and the oracle agree are not numbers (no d/f/x/p/e/inf/nan spellings).
NOT_A_NUMBER = st.text("ghjklmoqrsuvwz -_.", min_size=1, max_size=8).filter(lambda s: s.strip(" -_."))
DOUBLES = st.floats(allow_nan=False, allow_infinity=False)
# Up to a day before the start: no zone offset (at most 18 h) can push them into the future.
LOCAL_DATES = st.datetimes(datetime(1, 1, 2), EPOCH + (STARTED_MS - 86_400_000) * MS)
GAP_DATES = st.sampled_from(  # DST gaps and overlaps of the sampled zones, and the type's ends
    [
        datetime(2025, 3, 9, 2, 30),
        datetime(2025, 11, 2, 1, 30),
        datetime(2025, 3, 30, 1, 15),
        datetime(2025, 10, 26, 1, 45),
        datetime(2025, 10, 5, 2, 10),
        datetime(2025, 4, 6, 1, 50),
        datetime(2025, 9, 28, 2, 50),
        datetime(2025, 4, 6, 3, 0),
        datetime(1, 1, 1),
        datetime(1, 1, 1, 0, 0, 1),
        datetime(9999, 12, 31, 23, 59, 59),
    ]
)


def day(moment: datetime) -> str:
    return f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}"  # %Y does not pad year 461


def iso_text(moment: datetime, draw: st.DrawFn) -> str:
    separator = draw(st.sampled_from("T "))
    digits = draw(st.integers(0, 9))
    fraction = "." + "".join(draw(st.lists(st.sampled_from("0123456789"), min_size=digits, max_size=digits)))
    zone = draw(
        st.one_of(
            st.just(""),
            st.just("Z"),
            st.builds(
                lambda sign, h, m, colon: f"{sign}{h:02d}{':' if colon else ''}{m:02d}",
                st.sampled_from("+-"),
                st.integers(0, 14),
                st.sampled_from([0, 30, 45]),
                st.booleans(),
            ),
            st.sampled_from(["+14:00", "-12:00", "+18:00", "-18:00", "+05", "-0930"]),
        )
    )
    return f"{day(moment)}{separator}{moment:%H:%M:%S}{fraction if digits else ''}{zone}"


@st.composite
def good_ts(draw: st.DrawFn, variant: Variant) -> Any:
    if variant.time_format == "epoch_millis":
        millis = draw(
            st.one_of(st.integers(MIN_MS, STARTED_MS), st.sampled_from([MIN_MS, -1, 0, STARTED_MS]))
        )
        return draw(st.sampled_from([millis, str(millis)]))
    if variant.time_format == "epoch_seconds":
        low, high = Decimal(MIN_MS) / 1000, Decimal(STARTED_MS) / 1000
        return draw(
            st.one_of(
                st.decimals(low, high, places=9).map(lambda seconds: format(seconds, "f")),
                st.floats(-1e10, 1.7e9).map(lambda seconds: round(seconds, 6)),
                st.sampled_from([float(low), -0.001, 0.0]),
            )
        )
    moment = draw(st.one_of(LOCAL_DATES, GAP_DATES))
    if variant.time_format == "iso8601":
        return iso_text(moment, draw)
    return f"{day(moment)} {moment:%H:%M:%S}"


@st.composite
def bad_ts(draw: st.DrawFn, variant: Variant) -> Any:
    """Timestamps the contract refuses: beyond the type, beyond long, the future,
    text that is no time at all, impossible dates, time without a date."""
    if variant.time_format.startswith("epoch"):
        scale = 1 if variant.time_format == "epoch_millis" else 1000
        return draw(
            st.one_of(
                st.sampled_from(
                    [
                        (MIN_MS - 1) // scale,
                        MAX_MS // scale + 1,
                        2**63,
                        -(2**63) - 1,
                        10**19,
                        10**27,
                        -(10**25),
                    ]
                ),
                st.integers(FUTURE_MS // scale + 1, MAX_MS // scale),
                NOT_A_NUMBER,
                st.sampled_from(["", "12:00:00", "1e", "--1"]),
            )
        )
    texts = [
        "T10:00:00",
        "10:00:00",
        "2025-02-29 10:00:00",
        "2025-13-01 10:00:00",
        "2025-01-01 24:00:00",
        "2025-01-01 10:00:00 UTC",
        "9999-12-31 23:59:59",
        "0000-01-01 00:00:00",
        "",
    ]
    if variant.time_format == "iso8601":
        texts += [
            "2025-01-01T10:00:00Europe/Paris",
            "2025-01-01T10:00:00+19:00",
            "2025-01-01T10:00:00z",
            "9999-12-31T23:59:59-12:00",
            "0001-01-01T00:00:00+14:00",
            "2025",
            "2025-06-01T10:00Z",
        ]
    future = EPOCH + (FUTURE_MS + 86_400_000) * MS
    moment = draw(st.datetimes(future, datetime(9999, 12, 30)))
    future_text = (
        iso_text(moment, draw) if variant.time_format == "iso8601" else f"{day(moment)} {moment:%H:%M:%S}"
    )
    return draw(st.one_of(st.sampled_from(texts), st.just(future_text), NOT_A_NUMBER))


@st.composite
def payloads(draw: st.DrawFn, variant: Variant) -> dict[str, Any]:
    payload = {
        "device_id": draw(st.one_of(NAMES, st.integers(0, 10**6))),
        "ts": draw(good_ts(variant)),
        "region": draw(NAMES),
        "battery": draw(st.one_of(st.none(), DOUBLES)),
        "speed": draw(st.one_of(DOUBLES, st.sampled_from([0, -0.0, "  1.5 ", "7"]))),
        "partition": draw(st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(0, 9).map(str))),
    }
    if variant.file_format == "json" and draw(st.integers(0, 4)) == 0:
        payload["battery"] = payload.pop("battery")  # field order does not matter
    return payload


PAYLOAD_DEFECTS = ("wrong_type", "missing", "renamed", "bad_ts", "extra", "null", "drop_battery")
LINE_DEFECTS = {
    "json": (
        "truncate",
        "concat",
        "garbage",
        "bracket_tail",
        "not_object",
        "blank",
        "trailing_comma",
        "raw_control",
        "duplicate_key",
        "duplicate_number",
        "beyond_double",
        "bom",
        "deep",
        "unquoted_key",
    ),
    "csv": ("extra_field", "missing_field", "unterminated", "blank"),
}


def mutate(draw: st.DrawFn, payload: dict[str, Any], variant: Variant, defect: str) -> dict[str, Any]:
    """``payload`` with one defect in its fields."""
    payload = dict(payload)
    if defect == "wrong_type":
        column = draw(st.sampled_from(["battery", "speed", "partition", "ts"]))
        if column == "ts":  # a long column's fraction: a valid instant, but not a long
            payload["ts"] = draw(st.sampled_from(["12.5", 1.5])) if variant.ts_type == "long" else None
        else:
            wrong = [NOT_A_NUMBER, st.sampled_from([True, {"v": 1}, [1, 2]])]
            if column == "partition":
                wrong.append(st.sampled_from([2.5, "2.0", 2**31, -(2**31) - 1, "1e3"]))
            payload[column] = draw(st.one_of(*wrong))
    elif defect in ("missing", "renamed", "null"):
        column = draw(st.sampled_from(["device_id", "region", "ts", "partition"]))
        value = payload.pop(column)
        if defect == "renamed":
            payload[draw(st.sampled_from([column.upper(), column + "_", "Device_Id", "timestamp"]))] = value
        elif defect == "null":
            payload[column] = None
    elif defect == "bad_ts":
        payload["ts"] = draw(bad_ts(variant))
    elif defect == "extra":
        names = st.text(max_size=6).filter(lambda name: name not in FIELDS)
        payload.update(draw(st.dictionaries(names, NAMES, max_size=3)))
    elif defect == "drop_battery":
        payload.pop("battery", None)
    return payload


def broken_json(draw: st.DrawFn, line: str, payload: dict[str, Any], variant: Variant, defect: str) -> str:
    """A JSON line with one defect in its syntax (or, for duplicate keys, none)."""
    if defect == "truncate":
        return line[: draw(st.integers(1, len(line) - 1))]
    if defect == "concat":  # two records on one line: neither may vanish unnoticed
        return line + draw(st.sampled_from(["", " ", ",", "\t"])) + json.dumps(draw(payloads(variant)))
    if defect == "garbage":
        return line + draw(st.sampled_from([" x", "}", " // c", "\u2028", ",]", "]junk"]))
    if defect == "bracket_tail":
        return line + "]" + draw(st.sampled_from(["", ",[" + line, " " + line]))
    if defect == "not_object":
        return json.dumps(draw(st.sampled_from([[payload], "text", 42, None, [], True])))
    if defect == "trailing_comma":
        return line[:-1] + ",}"
    if defect == "raw_control":
        return line[:-1] + ', "note": "a' + draw(st.sampled_from(["\x01", "\x1f", "\t", "\x7f"])) + 'b"}'
    if defect == "duplicate_key":  # the last value wins, in Spark and in Python
        return line[:-1] + ', "region": ' + json.dumps(draw(NAMES)) + "}"
    if defect == "duplicate_number":  # Spark's typed JSON read keeps the first if the last fails
        column = draw(st.sampled_from(["battery", "partition"]))
        value = draw(st.sampled_from(['"x"', "2", "null", '"3"', "true"]))
        return line[:-1] + f', "{column}": {value}' + "}"
    if defect == "beyond_double":  # JSON reads it as infinite; as text it is no number
        return line[:-1] + ', "speed": ' + draw(st.sampled_from(["1e400", "-1e400"])) + "}"
    if defect == "bom":
        return "\ufeff" + line
    if defect == "deep":
        levels = draw(st.sampled_from([5, 1_500]))
        return line[:-1] + ', "nested": ' + "[" * levels + "]" * levels + "}"
    if defect == "unquoted_key":
        return line.replace('"device_id"', "device_id", 1)
    return line


def broken_csv(line: str, defect: str) -> str:
    if defect == "extra_field":
        return line + ",surplus"
    if defect == "missing_field":
        return line[: line.rindex(",")] if "," in line else line
    if defect == "unterminated" and '"' not in line:
        return '"' + line
    return line


@st.composite
def record_line(draw: st.DrawFn, variant: Variant, defect: str) -> str:
    payload = draw(payloads(variant))
    if defect in PAYLOAD_DEFECTS:
        payload = mutate(draw, payload, variant, defect)
    if defect == "blank":
        return draw(st.sampled_from(["", " ", "   ", "\t"]))
    if variant.file_format == "json":
        line = json.dumps(
            payload,
            ensure_ascii=draw(st.booleans()),
            separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])),
        )
        return broken_json(draw, line, payload, variant, defect)
    text = {name: json.dumps(v) if isinstance(v, dict | list | bool) else v for name, v in payload.items()}
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow(["" if text.get(f) is None else text[f] for f in FIELDS])
    return broken_csv(out.getvalue(), defect)


HEADERS = [
    ",".join(FIELDS),
    ",".join(FIELDS) + ",extra",  # drift: an added column
    ",".join(f for f in FIELDS if f != "speed"),  # a removed one
    ",".join(FIELDS).replace("device_id", "device"),  # a renamed one
    ",".join(FIELDS).upper(),
    "\ufeff" + ",".join(FIELDS),  # a BOM
]


@dataclass(frozen=True)
class LandingFile:
    name: str
    lines: list[str]  # the CSV header first
    ending: str  # "\n" or "\r\n"
    final_newline: bool

    def text(self) -> str:
        return self.ending.join(self.lines) + (self.ending if self.final_newline else "")


@st.composite
def landings(draw: st.DrawFn, variant: Variant) -> tuple[str, list[LandingFile]]:
    timezone = draw(st.sampled_from(variant.timezones))
    # Every defect at least once, among good records and more defects, in any order.
    defects = [*PAYLOAD_DEFECTS, *LINE_DEFECTS[variant.file_format]]
    more = draw(st.lists(st.sampled_from(["none"] * len(defects) + defects), min_size=40, max_size=90))
    kinds = draw(st.permutations(["none"] * 6 + defects + more))
    records = [draw(record_line(variant, kind)) for kind in kinds]
    cuts = sorted(draw(st.lists(st.integers(0, len(records)), min_size=1, max_size=2)))
    files = []
    for index, (start, end) in enumerate(itertools.pairwise([0, *cuts, len(records)])):
        header = (
            [draw(st.sampled_from(HEADERS[:1] * 4 + HEADERS[1:]))] if variant.file_format == "csv" else []
        )
        ending, final = draw(st.sampled_from(["\n", "\r\n"])), draw(st.booleans())
        files.append(
            LandingFile(f"f{index}.{variant.file_format}", header + records[start:end], ending, final)
        )
    return timezone, files


def input_records(landed: LandingFile, has_header: bool) -> dict[int, tuple[str, str | None]]:
    """Line number -> (record, CSV header) as the file contract reads the bytes: lines
    split at \\n, one trailing \\r dropped, a final newline adds no record."""
    lines = landed.text().split("\n")
    if lines[-1] == "":
        lines.pop()
    lines = [line.removesuffix("\r") for line in lines]
    header = lines[0] if has_header and lines else None
    return {number: (raw, header) for number, raw in enumerate(lines, start=1) if number > has_header}


# ---------------------------------------------------------------- the test
EXAMPLE = itertools.count()


def shown(raw: str) -> str:
    return repr(raw if len(raw) < 300 else f"{raw[:150]}...{raw[-150:]}")


@pytest.fixture(scope="module")
def lakehouse(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz-lakehouse")


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
@settings(
    # The same examples on every run, so CI is reproducible; more of them with
    # TIDEMARK_FUZZ_EXAMPLES (a Spark run each).
    max_examples=int(os.environ.get("TIDEMARK_FUZZ_EXAMPLES", "2")),
    derandomize=True,
    deadline=None,
    phases=(Phase.explicit, Phase.reuse, Phase.generate),  # a Spark run per example: no shrinking
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
@given(data=st.data())
def test_bad_input_is_rejected_good_input_lands_and_nothing_is_lost_or_doubled(
    spark, lakehouse, variant, data
):
    timezone, landed = data.draw(landings(variant))
    example = f"{variant.name}-{next(EXAMPLE)}"
    landing = lakehouse / "landing" / example
    landing.mkdir(parents=True)
    for file in landed:
        (landing / file.name).write_bytes(file.text().encode("utf-8"))
    config = variant.config(landing, timezone)
    registry = TableRegistry(config, str(lakehouse))
    checkpoint = str(lakehouse / "_checkpoints" / example)
    context = JobContext("bronze", config, registry, "available-now", 1_000, checkpoint)

    assert bronze.run(spark, context) == 0

    expected = {
        (file.name, number): (raw, judge(raw, header, variant, timezone))
        for file in landed
        for number, (raw, header) in input_records(file, variant.file_format == "csv").items()
    }
    mine = F.col("source_file").contains(f"/{example}/")
    file_name = F.regexp_extract("source_file", r"[^/]*$", 0).alias("file")
    rows = (
        spark.read.format("delta")
        .load(registry.bronze.path)
        .where(mine)
        .select(file_name, "source_offset", "event_id", *FIELDS, F.unix_millis("event_time").alias("ms"))
        .collect()
    )
    rejects = (
        spark.read.format("delta")
        .load(registry.ops["rejects"].path)
        .where(mine & (F.col("pipeline") == config.name))
        .select(file_name, "source_offset", "raw_record", "reason", "detail")
        .collect()
    )
    seen = Counter([(r.file, r.source_offset) for r in rows] + [(r.file, r.source_offset) for r in rejects])
    problems = [f"{where}: landed {n} times" for where, n in seen.items() if n != 1]
    problems += [f"{where}: lost ({shown(expected[where][0])})" for where in expected.keys() - seen.keys()]
    problems += [f"{where}: not an input line" for where in seen.keys() - expected.keys()]
    for row in rows:
        raw, verdict = expected.get((row.file, row.source_offset), ("", Verdict("?")))
        actual = {name: row[name] for name in FIELDS}
        if verdict.reason is not None:
            problems.append(
                f"{row.file}:{row.source_offset} landed in bronze, expected {verdict.reason}: {shown(raw)}"
            )
        elif actual != verdict.payload or row.ms != verdict.event_ms:
            problems.append(
                f"{row.file}:{row.source_offset} {shown(raw)}: bronze has {actual} at {row.ms}, "
                f"expected {verdict.payload} at {verdict.event_ms}"
            )
    for row in rejects:
        raw, verdict = expected.get((row.file, row.source_offset), ("", Verdict("?")))
        if (row.raw_record, row.reason) != (raw, verdict.reason) or not row.detail:
            problems.append(
                f"{row.file}:{row.source_offset} {shown(raw)}: rejected as {row.reason} ({row.detail}), "
                f"expected {verdict.reason}; raw kept {row.raw_record == raw}"
            )
    assert len({r.event_id for r in rows}) == len(rows), "duplicate event ids"
    assert not problems, f"{len(problems)} problems (zone {timezone}):\n" + "\n".join(problems[:15])
