"""Offline detection as DataFrame -> DataFrame steps: Bird's buffered event-time
timers (seed 003) at Spark scale, with window functions instead of a per-record
loop (DESIGN §4b).

A key's tracks wait in a buffer until the watermark passes them. Then, per key,
the due tracks are put in event-time order behind the key's ``last`` handled
track, and one pass of ``lag`` derives every transition the reference model's
:class:`~spark_jobs.eventtime.timers.OfflineDetector` would emit:

- a gap longer than the timeout between two consecutive tracks is an OFFLINE at
  ``previous + timeout`` and an ONLINE at the track (a gap of exactly the
  timeout keeps the key online: at equal times a track comes before a timer);
- a track after a key that was already OFFLINE is an ONLINE;
- the key's newest track arms a timer at ``newest + timeout``, which fires an
  OFFLINE when the watermark has reached it;
- a key's first track emits nothing.

Every due track is later than the key's ``last`` track, because the watermark
had not passed it when ``last`` was handled, so the order is total.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from spark_jobs.eventtime.timers import OFFLINE, ONLINE
from spark_jobs.sql import column_of

EVENT_COLUMNS = ("status", "event_ms")


def handled_sequence(last: DataFrame, due: DataFrame, key: Sequence[str]) -> DataFrame:
    """Per key, the ``last`` row (``ts_ms``, ``status``) followed by the due tracks
    (``ts_ms``) in event-time order, each with its predecessor's time and status."""
    tracks = due.select(*key, "ts_ms").distinct()
    rows = last.select(*key, "ts_ms", "status", F.lit(True).alias("is_last")).unionByName(
        tracks.select(
            *key, "ts_ms", F.lit(None).cast("string").alias("status"), F.lit(False).alias("is_last")
        )
    )
    order = Window.partitionBy(*key).orderBy("ts_ms")
    return rows.withColumn("previous_ms", F.lag("ts_ms").over(order)).withColumn(
        "previous_status", F.lag("status").over(order)
    )


def _event(frame: DataFrame, key: Sequence[str], condition: Column, status: str, at: Column) -> DataFrame:
    return frame.where(condition).select(*key, F.lit(status).alias("status"), at.alias("event_ms"))


def transitions(
    last: DataFrame, due: DataFrame, key: Sequence[str], timeout_ms: int, watermark: int
) -> tuple[DataFrame, DataFrame]:
    """(status events, new ``last`` rows) once the watermark reaches ``watermark``.

    ``last``: one row per key seen before, ``ts_ms`` of its last handled track and
    its ``status`` (online or offline). ``due``: tracks at or below ``watermark``.
    Events have ``status`` and ``event_ms``; the new ``last`` rows cover every key
    that handled a track or whose timer fired."""
    sequence = handled_sequence(last, due, key)
    timeout = F.lit(timeout_ms)
    tracks = sequence.where(~F.col("is_last"))
    follows = F.col("previous_ms").isNotNull()
    gap = follows & (F.col("ts_ms") - F.col("previous_ms") > timeout)
    was_offline = F.coalesce(F.col("previous_status") == OFFLINE, F.lit(False))
    gap_offline = _event(tracks, key, gap & ~was_offline, OFFLINE, F.col("previous_ms") + timeout)
    back_online = _event(tracks, key, follows & (gap | was_offline), ONLINE, F.col("ts_ms"))

    newest = (
        sequence.groupBy(*key)
        .agg(F.max_by(F.struct("ts_ms", "status", "is_last"), "ts_ms").alias("newest"))
        .select(*key, "newest.*")
    )
    # A handled track leaves the key online; a ``last`` row keeps its status.
    online = F.when(F.col("is_last"), F.col("status")).otherwise(F.lit(ONLINE)) == ONLINE
    timer_due = online & (F.col("ts_ms") + timeout <= F.lit(watermark))
    timer_offline = _event(newest, key, timer_due, OFFLINE, F.col("ts_ms") + timeout)
    new_last = newest.where(~F.col("is_last") | timer_due).select(
        *key,
        "ts_ms",
        F.when(timer_due, F.lit(OFFLINE)).otherwise(F.lit(ONLINE)).alias("status"),
    )
    return gap_offline.unionByName(back_online).unionByName(timer_offline), new_last


def detection_watermark(event_ms: Column, watermarks: Sequence[int]) -> Column:
    """The first of the batch's successive watermarks that reached the event: the
    watermark it is detected at, as if every micro-batch had been its own trigger."""
    steps = F.array(*[F.lit(value).cast("long") for value in sorted(set(watermarks))])
    return F.array_min(F.filter(steps, lambda step: step >= event_ms))


# What a detector change row asks of the state row it matches: ``upsert`` replaces its
# track, status and version (or adds the row), ``delete`` removes it, ``insert`` adds
# the row where none matches and leaves a matching one as it is.
UPSERT, DELETE, INSERT = "upsert", "delete", "insert"


def changed_state(state: DataFrame, changes: DataFrame, same_row: Column, now: Column) -> DataFrame:
    """The detector's state rows (``state``, aliased ``t`` in ``same_row``) after its
    ``changes`` (aliased ``s``; at most one per state row): matched rows replaced or
    removed as each change's ``action`` says, unmatched changes other than deletes
    added, every row written stamped ``now``. One join, so the changes are derived once."""
    action = column_of("s", "action")
    # A state row's kind is never null: a null one is a change without a state row.
    has_row = column_of("t", "kind").isNotNull()
    kept_as_is = has_row & (action.isNull() | (action == F.lit(INSERT)))

    def value(column: str) -> Column:
        if column == "updated_at":
            return F.when(kept_as_is, column_of("t", column)).otherwise(now)
        from_change = ~has_row | ((action == F.lit(UPSERT)) & F.lit(column in UPSERT_REPLACES))
        return F.when(from_change, column_of("s", column)).otherwise(column_of("t", column))

    return (
        state.alias("t")
        .join(changes.alias("s"), same_row, "full_outer")
        .where(action.isNull() | (action != F.lit(DELETE)))
        .select(*(value(column).alias(column) for column in state.columns))
    )


# The columns of a state row an upsert replaces (its key and kind stay).
UPSERT_REPLACES = ("ts_ms", "status", "version")
