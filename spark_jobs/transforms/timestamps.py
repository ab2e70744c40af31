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
ZONE_SUFFIX = r"(Z|[+-][0-9]{2}(:?[0-9]{2})?)$"
ZONE_PATTERN_LETTERS = re.compile(r"[XxZzOV]")
EPOCH_SCALE = {"epoch_millis": 1, "epoch_seconds": 1_000}


def _pattern_has_zone(pattern: str) -> bool:
    unquoted = re.sub(r"'[^']*'", "", pattern)
    return bool(ZONE_PATTERN_LETTERS.search(unquoted))


def _wall_clock_to_utc(local: Column, timezone: str) -> Column:
    """A wall-clock time parsed in the (UTC) session zone, re-read in ``timezone``."""
    return local if timezone == "UTC" else F.to_utc_timestamp(local, timezone)


def event_time_millis(raw: Column, event_time: EventTimeConfig) -> Column:
    """Epoch milliseconds of ``raw`` (the column's text, or its JSON number), null when
    unreadable. Epoch values are exact decimals and may lie outside Spark's
    timestamp range: check with :func:`in_timestamp_range` before converting."""
    if event_time.format in EPOCH_SCALE:
        number = raw.try_cast("decimal(38,6)")
        return F.floor(F.try_multiply(number, F.lit(EPOCH_SCALE[event_time.format])))
    if event_time.format == "iso8601":
        local = _wall_clock_to_utc(raw.try_cast("timestamp"), event_time.timezone)
        instant = F.when(raw.rlike(ZONE_SUFFIX), raw.try_cast("timestamp")).otherwise(local)
        return F.unix_millis(instant)
    parsed = F.try_to_timestamp(raw, F.lit(event_time.format))
    if not _pattern_has_zone(event_time.format):
        parsed = _wall_clock_to_utc(parsed, event_time.timezone)
    return F.unix_millis(parsed)


def in_timestamp_range(millis: Column) -> Column:
    return millis.between(MIN_TIMESTAMP_MS, MAX_TIMESTAMP_MS)


def millis_to_timestamp(millis: Column) -> Column:
    """``timestamp_millis`` guarded against overflow: out of range gives null."""
    return F.timestamp_millis(F.when(in_timestamp_range(millis), millis.cast("bigint")))
