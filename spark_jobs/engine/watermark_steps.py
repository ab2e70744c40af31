"""Watermark steps that bring no records: the end of input (flush) and idleness
(a quiet stream), through the same tracker and firing as a silver batch."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from pyspark.sql import SparkSession

from spark_jobs.engine.clocks import (
    VersionClock,
    clock_memory,
    load_clock,
    recall_stream_clock,
    utc_moment,
    write_history,
    write_partition_clocks,
)
from spark_jobs.engine.session_store import fire_due_sessions
from spark_jobs.engine.window_store import fire_due
from spark_jobs.eventtime.clock import MAX_WATERMARK, MIN_WATERMARK
from spark_jobs.eventtime.windows import SessionSpec
from spark_jobs.faults import crash_point
from spark_jobs.lakehouse.checkpoints import stream_app_id
from spark_jobs.lakehouse.create import create_missing
from spark_jobs.lakehouse.log import batch_metadata
from spark_jobs.tables import TableRegistry


def fire_silver(
    spark: SparkSession, registry: TableRegistry, watermark: int, label: str, now: datetime
) -> None:
    """Fire and close what ``watermark`` has passed in silver: windows, or sessions."""
    fire = fire_due_sessions if isinstance(registry.config.window, SessionSpec) else fire_due
    fire(spark, registry, watermark, label, now)


def flush(spark: SparkSession, registry: TableRegistry, after_stream: str | None = None) -> bool:
    """End of input, like a bounded Flink source: the watermark moves to +inf, so
    every window fires and closes. Returns False when it had already ended.

    ``after_stream``: the checkpoint of a silver stream that ran in this process just
    before (a replay, ``--flush``): the clock it left in memory is taken instead of
    being read back from two tables (unless another writer has committed to them)."""
    create_missing(spark, registry)
    if after_stream is None:
        saved = load_clock(spark, registry)
    else:
        app_id = stream_app_id(spark, after_stream)
        saved = recall_stream_clock(spark, registry, app_id)
        # The flush moves this tracker: the stream reads its clock back next time,
        # whether or not the flush commits.
        clock_memory(app_id, registry).forget()
    tracker = saved.tracker
    if tracker.watermark == MAX_WATERMARK:
        return False
    recorded = [v for v in (saved.last_step_batch, saved.judged_version) if v is not None]
    version = max(recorded, default=-1)
    state = tracker.flush()
    now = datetime.now(UTC)
    app_id = f"flush-{registry.config.name}"
    fire_silver(spark, registry, MAX_WATERMARK, batch_metadata(f"{app_id}:silver", version + 1, {}), now)
    crash_point("flush:fire")
    now_ms = round(now.timestamp() * 1000)
    clock = VersionClock(
        version + 1, now_ms, MIN_WATERMARK, MAX_WATERMARK, state.active_partitions, state.idle_partitions
    )
    write_history(spark, registry, [clock], app_id, version + 1)
    crash_point("flush:history")
    return True


def advance_idle(
    spark: SparkSession, registry: TableRegistry, now: datetime, backlog: Iterable[str] = ()
) -> VersionClock | None:
    """A watermark step without records, for when silver is quiet (no bronze
    version left to judge): partitions quiet for the idleness timeout become idle,
    unless they are in ``backlog`` (unread input at the source, such as Kafka lag),
    the watermark moves as the valve says, and the windows it passed fire, through
    the same tracker and firing update as a streaming batch. Recorded as a history
    step on the last judged version. Returns the step, or None if nothing moved
    or the input has ended. The snapshot in ``ops.watermarks`` is refreshed after the
    step, or when it is found behind (a crash between a step and its refresh)."""
    saved = load_clock(spark, registry)
    last_version, tracker = saved.judged_version, saved.tracker
    if last_version is None:
        return None
    before = tracker.watermark
    if before == MAX_WATERMARK:  # the input has ended (flushed): there is nothing left to step
        return None
    idle_before = {snapshot.partition for snapshot in tracker.snapshots() if snapshot.is_idle}
    # Whole milliseconds: the step's moment is its history row's and its transaction version.
    # After the step it follows, whose moment is bronze's clock (maybe another host's):
    # at the same judged version the later moment holds the clocks.
    now_ms = int(now.timestamp() * 1000)
    if saved.recorded_ms is not None:
        now_ms = max(now_ms, saved.recorded_ms + 1)
    now = utc_moment(now_ms)
    state = tracker.advance(now_ms, {}, backlog)
    idle_after = {snapshot.partition for snapshot in tracker.snapshots() if snapshot.is_idle}
    app_id = f"idle-{registry.config.name}"
    moved = state.watermark != before or idle_after != idle_before
    clock = None
    if moved:
        fire_silver(spark, registry, state.watermark, batch_metadata(f"{app_id}:silver", now_ms, {}), now)
        crash_point("idle:fire")
        clock = VersionClock(
            last_version, now_ms, before, state.watermark, state.active_partitions, state.idle_partitions
        )
        # The step's one clock commit: its history row with the partition clocks after it.
        write_history(spark, registry, [clock], app_id, now_ms, tracker)
        crash_point("idle:history")
    if moved or saved.snapshot_stale:
        snapshot = tracker if moved else load_clock(spark, registry).tracker
        write_partition_clocks(
            spark, registry, snapshot, last_version, (f"{app_id}:watermarks", now_ms), now, never_back=True
        )
        crash_point("idle:clocks")
    return clock
