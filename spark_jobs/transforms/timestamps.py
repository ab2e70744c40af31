"""Timestamp assignment (DESIGN §2): the configured column and format -> event time.

Everything is a Column expression evaluated by Spark; nothing throws on bad
input (ANSI mode is on in Spark 4, so every conversion is a ``try_`` form and
out-of-range values are filtered before ``timestamp_millis`` sees them).
"""

from __future__ import annotations

import re

from pyspark.sql import Column
from pyspark.sql import functions as F

from spark_jobs.config import EventTimeConfig

# Spark timestamps span 0001-01-01 .. 9999-12-31 (UTC).
MIN_TIMESTAMP_MS = -62_135_596_800_000
MAX_TIMESTAMP_MS = 253_402_300_799_999
# Group 3 is the zone; Spark's cast checks the field ranges.
ISO_8601 = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}"
    r"([T ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?(Z|[+-][0-9]{2}(:?[0-9]{2})?)?)?$"
)
ZONE_PATTERN_LETTERS = re.compile(r"[XxZzOV]")
EPOCH_SCALE = {"epoch_millis": 1, "epoch_seconds": 1_000}


def _pattern_has_zone(pattern: str) -> bool:
    unquoted = re.sub(r"'[^']*'", "", pattern)
    return bool(ZONE_PATTERN_LETTERS.search(unquoted))


def _wall_clock_to_utc(local: Column, timezone: str) -> Column:
    """A wall-clock time parsed in the (UTC) session zone, re-read in ``timezone``."""
    return local if timezone == "UTC" else F.to_utc_timestamp(local, timezone)


def _iso8601(raw: Column, timezone: str) -> Column:
    """``yyyy-MM-dd[(T| )HH:mm:ss[.fraction][zone]]``; without a zone it is a wall-clock
    time in ``timezone``. Spark's cast alone would also take a time without a date
    (today's date: a replay on another day would move the record) and zone names."""
    instant = raw.try_cast("timestamp")
    if timezone != "UTC":
        has_zone = F.regexp_extract(raw, ISO_8601, 3) != ""
        instant = F.when(has_zone, instant).otherwise(_wall_clock_to_utc(instant, timezone))
    return F.when(raw.rlike(ISO_8601), instant)


def event_time_millis(raw: Column, event_time: EventTimeConfig) -> Column:
    """Epoch milliseconds of ``raw`` (the column's text, or its JSON number), null when
    unreadable. Epoch values are exact decimals and may lie outside Spark's
    timestamp range: check with :func:`in_timestamp_range` before converting."""
    if event_time.format in EPOCH_SCALE:
        # Nine decimals, so that rounding the text to the decimal cannot carry a
        # fraction over a millisecond (1.2349996 s is 1234 ms, not 1235).
        number = raw.try_cast("decimal(38,9)")
        scale = EPOCH_SCALE[event_time.format]
        exact = F.floor(number if scale == 1 else F.try_multiply(number, F.lit(scale)))
        # A whole number (the usual case) converts as a long, which is cheaper;
        # where both convert they agree, and anything else takes the decimal.
        whole = raw.try_cast("bigint")
        return F.coalesce(whole if scale == 1 else F.try_multiply(whole, F.lit(scale)), exact)
    if event_time.format == "iso8601":
        return F.unix_millis(_iso8601(raw, event_time.timezone))
    parsed = F.try_to_timestamp(raw, F.lit(event_time.format))
    if not _pattern_has_zone(event_time.format):
        parsed = _wall_clock_to_utc(parsed, event_time.timezone)
    return F.unix_millis(parsed)


def in_timestamp_range(millis: Column) -> Column:
    return millis.between(MIN_TIMESTAMP_MS, MAX_TIMESTAMP_MS)


def millis_to_timestamp(millis: Column) -> Column:
    """``timestamp_millis`` guarded against overflow: out of range gives null."""
    return F.timestamp_millis(F.when(in_timestamp_range(millis), millis.cast("bigint")))
