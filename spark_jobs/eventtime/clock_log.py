"""Where the pipeline clock is kept between runs, and how it is read back: one rule
for the silver job, the idleness check, the flush, the plugin's page and the sensor.

Every watermark step (a silver micro-batch, an idleness step, the end of input) is
appended to ``ops.watermark_history`` in one commit. The last row of a silver batch or
an idleness step carries the partition clocks after it (``partition_clocks``): that
append is the step's only clock commit, so a crash leaves a step either wholly
recorded or not at all. ``ops.watermarks`` is a snapshot of the same clocks, stamped
with the judged version it holds (``batch_id``) and refreshed off the hot path (when a
silver run ends, every so often while it runs, by the idleness check). The current
clock is the newest step that carries clocks from the snapshot's version on, else the
snapshot itself, so a reader touches the snapshot and the few steps since it, never
the whole history (DESIGN §4b).

Rows are plain mappings, so Spark rows and delta-rs rows go through the same rule:
a snapshot row has ``batch_id`` and the clock keys; a step has ``batch_id``,
``watermark``, ``processing_ms`` and ``partition_clocks`` (a list of clock mappings or
None). Times are epoch milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from spark_jobs.eventtime.clock import MAX_WATERMARK
from spark_jobs.eventtime.tracker import PartitionSnapshot


@dataclass(frozen=True)
class ClockState:
    """The pipeline clock as the last recorded step left it.

    ``judged_version``: the last bronze version silver judged (None before its first
    batch); ``watermark``: the combined watermark (None before any step);
    ``last_step_batch``: the largest batch id among the steps read (the end of input
    is recorded one beyond the judged version); ``snapshot_stale``: ``ops.watermarks``
    does not hold these clocks (a writer should refresh it); ``recorded_ms``: the
    processing time of the step the clocks come from (None: from the snapshot)."""

    judged_version: int | None
    watermark: int | None
    partitions: tuple[PartitionSnapshot, ...]
    last_step_batch: int | None
    snapshot_stale: bool
    recorded_ms: int | None = None


def partition_snapshot(clock: Mapping) -> PartitionSnapshot:
    return PartitionSnapshot(
        str(clock["source_partition"]),
        clock["max_event_ms"],
        clock["partition_watermark"],
        clock["last_data_ms"],
        bool(clock["is_idle"]),
        bool(clock["is_aligned"]),
        # Absent from clocks recorded before custom generators existed.
        clock.get("generator_state"),
    )


def clock_entry(snapshot: PartitionSnapshot) -> dict[str, object]:
    """One partition's clock as ``partition_clocks`` stores it."""
    return {
        "source_partition": str(snapshot.partition),
        "max_event_ms": snapshot.max_timestamp,
        "partition_watermark": snapshot.watermark,
        "last_data_ms": snapshot.last_data_at,
        "is_idle": snapshot.is_idle,
        "is_aligned": snapshot.is_aligned,
        "generator_state": snapshot.generator_state,
    }


def snapshot_version(snapshot: Sequence[Mapping]) -> int | None:
    """The judged version ``ops.watermarks`` holds: readers take the steps from it on."""
    return max((row["batch_id"] for row in snapshot if row["batch_id"] is not None), default=None)


def committed(step: Mapping, judged_version: int | None) -> bool:
    """Whether a step belongs to the clock: up to the judged version, or the end of
    input (recorded one beyond it, and final). Lakehouses written before the clocks
    moved into the history may hold rows of a batch that died before its clocks; they
    lie beyond the judged version and are not part of the clock."""
    if step["watermark"] == MAX_WATERMARK:
        return True
    return judged_version is not None and step["batch_id"] <= judged_version


def clock_state(snapshot: Sequence[Mapping], steps: Sequence[Mapping]) -> ClockState:
    """The current clock from ``ops.watermarks``' rows of a pipeline and its
    ``ops.watermark_history`` steps from the snapshot's version on.

    The newest step with clocks wins, by batch id and then processing time: an
    idleness step reuses the judged version and comes after the batch that judged it,
    while one planned before a later batch committed carries an older version and
    never wins over it (watermarks never go back)."""
    clocked = [step for step in steps if step["partition_clocks"] is not None]
    newest = max(clocked, key=lambda step: (step["batch_id"], step["processing_ms"]), default=None)
    held = sorted((partition_snapshot(row) for row in snapshot), key=lambda clock: clock.partition)
    if newest is None:
        judged, partitions = snapshot_version(snapshot), held
    else:
        judged = newest["batch_id"]
        clocks = (partition_snapshot(clock) for clock in newest["partition_clocks"])
        partitions = sorted(clocks, key=lambda clock: clock.partition)
    watermarks = [step["watermark"] for step in steps if committed(step, judged)]
    return ClockState(
        judged,
        max(watermarks, default=None),
        tuple(partitions),
        max((step["batch_id"] for step in steps), default=None),
        snapshot_stale=partitions != held or (judged is not None and snapshot_version(snapshot) != judged),
        recorded_ms=None if newest is None else newest["processing_ms"],
    )
