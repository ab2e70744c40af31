"""Read the lakehouse's ops and quarantine tables without Spark.

Airflow's api-server, sensors and workers poll these tables often; a JVM per
poll would cost seconds and a gigabyte. delta-rs (the ``deltalake`` package)
reads the Delta log (checkpoints, JSON commits, deletion vectors) and the
Parquet files directly, pruning files by partition (``pipeline``, ``status``)
before reading them.

Every function takes the lakehouse root (``spark_jobs.tables.lakehouse_root``
resolves it) and a pipeline name. A table that does not exist yet (a pipeline
that never ran) reads as empty: the functions return ``None``, ``[]`` or
``{}``, never raise for it.

Watermarks are ``bigint`` epoch milliseconds, with ``Long.MIN_VALUE`` for -inf
(before any data) and ``Long.MAX_VALUE`` for +inf (end of input);
:func:`is_finite` tells them apart.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

MIN_WATERMARK = -(2**63)
MAX_WATERMARK = 2**63 - 1

CLOCK_COLUMNS = [
    "source_partition",
    "partition_watermark",
    "max_event_time",
    "is_idle",
    "is_aligned",
    "last_data_at",
    "updated_at",
]
HISTORY_COLUMNS = [
    "batch_id",
    "watermark",
    "processing_time",
    "active_partitions",
    "idle_partitions",
    "on_time_count",
    "late_count",
]
RUN_COLUMNS = [
    "run_id",
    "job",
    "status",
    "batches",
    "rows_in",
    "rows_out",
    "late",
    "rejected",
    "started_at",
    "ended_at",
    "duration_ms",
    "message",
]


def is_finite(watermark: int | None) -> bool:
    """False for a missing watermark and for the -inf/+inf sentinels."""
    return watermark is not None and MIN_WATERMARK < watermark < MAX_WATERMARK


def _sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _open(root: str, layer: str, name: str) -> DeltaTable | None:
    try:
        return DeltaTable(f"{root.rstrip('/')}/{layer}/{name}")
    except TableNotFoundError:
        return None


def _read(root: str, layer: str, name: str, columns: list[str], where: str) -> pa.Table | None:
    """``columns`` of the rows matching the SQL predicate ``where``; None if no table."""
    table = _open(root, layer, name)
    if table is None:
        return None
    # scan() runs delta-rs's own engine, which prunes partitions and applies
    # deletion vectors; the pyarrow dataset path refuses tables that have them.
    read = pa.table(table.scan(columns=columns, predicate=where))
    # The engine returns strings as string_view, which pyarrow's take() and sorts lack.
    return read.cast(pa.schema(_plain(field) for field in read.schema))


def _plain(field: pa.Field) -> pa.Field:
    return field.with_type(pa.string()) if pa.types.is_string_view(field.type) else field


def _of_pipeline(pipeline: str) -> str:
    return f"pipeline = {_sql_string(pipeline)}"


def judged_version(root: str, pipeline: str) -> int | None:
    """The last bronze version silver judged (``ops.watermarks``' batch id: one
    row per source partition), or None before its first batch."""
    clocks = _read(root, "ops", "watermarks", ["batch_id"], _of_pipeline(pipeline))
    if clocks is None or clocks.num_rows == 0:
        return None
    return pc.max(clocks.column("batch_id")).as_py()


def _steps(root: str, pipeline: str, columns: list[str], first_batch: int | None) -> pa.Table | None:
    """The pipeline's ``ops.watermark_history`` steps from batch ``first_batch`` on
    (all when None): delta-rs skips the files of older steps by their statistics,
    so a page load or a sensor's poke does not read the whole history."""
    where = _of_pipeline(pipeline)
    if first_batch is not None:
        where += f" AND batch_id >= {first_batch:d}"
    return _read(root, "ops", "watermark_history", columns, where)


def pipeline_watermark(root: str, pipeline: str) -> int | None:
    """The pipeline's combined watermark: the highest committed
    ``ops.watermark_history`` step. Watermarks never go backwards, so it is at or
    after the last judged version's step. None before its first batch.

    A silver batch's history rows may commit before its windows do, and always
    before its partition clocks: rows beyond the judged version belong to a batch
    still at work (or that died), and a sensor that believed them would read
    windows not yet fired. The end of input (+inf) is final. This is the engine's
    ``committed_steps`` rule."""
    judged = judged_version(root, pipeline)
    history = _steps(root, pipeline, ["batch_id", "watermark"], judged)
    if history is None or history.num_rows == 0:
        return None
    batch, watermark = history.column("batch_id"), history.column("watermark")
    committed = pc.equal(watermark, MAX_WATERMARK)
    if judged is not None:
        committed = pc.or_(committed, pc.less_equal(batch, judged))
    return pc.max(pc.filter(watermark, committed)).as_py()


def _partition_order(name: str) -> tuple[bool, int, str]:
    # Kafka and file partitions are numbers kept as strings: 2 before 10.
    return (not name.isdigit(), int(name) if name.isdigit() else 0, name)


def partition_clocks(root: str, pipeline: str) -> list[dict[str, Any]]:
    """One row per source partition from ``ops.watermarks`` (its watermark,
    newest event time, idle and aligned flags, last data and update times), in
    partition order, each with ``lag_ms`` = pipeline watermark - partition
    watermark when both are finite (else None): 0 for the partition that holds
    the pipeline's watermark, negative for active ones ahead of it, positive for
    idle or catching-up ones behind it."""
    clocks = _read(root, "ops", "watermarks", CLOCK_COLUMNS, _of_pipeline(pipeline))
    if clocks is None:
        return []
    combined = pipeline_watermark(root, pipeline)
    rows = sorted(clocks.to_pylist(), key=lambda row: _partition_order(row["source_partition"]))
    for row in rows:
        own = row["partition_watermark"]
        row["lag_ms"] = combined - own if is_finite(combined) and is_finite(own) else None
    return rows


def last_user_metadata(root: str, layer: str, name: str, lookback: int) -> str | None:
    """The userMetadata of the newest of a table's last ``lookback`` commits that
    carries one (bronze's: what the source reported with its last batch)."""
    table = _open(root, layer, name)
    if table is None:
        return None
    for commit in table.history(lookback):
        if commit.get("userMetadata"):
            return commit["userMetadata"]
    return None


def quarantine_backlog_by_partition(root: str, pipeline: str) -> dict[str, dict[str, int]]:
    """Pending (not yet merged) rows per quarantine table of the pipeline and
    source partition: ``late`` (records whose windows were cleaned,
    ``quarantine.<p>_late``) and, for pipelines with offline detection,
    ``late_tracks`` (``quarantine.<p>_late_tracks``). A table that does not
    exist has no key; partitions without pending rows are left out."""
    backlog: dict[str, dict[str, int]] = {}
    for key, name in (("late", f"{pipeline}_late"), ("late_tracks", f"{pipeline}_late_tracks")):
        pending = _read(root, "quarantine", name, ["source_partition"], "status = 'pending'")
        if pending is not None:
            counts = pc.value_counts(pending.column("source_partition")).to_pylist()
            backlog[key] = {str(count["values"]): count["counts"] for count in counts}
    return backlog


def quarantine_backlog(root: str, pipeline: str) -> dict[str, int]:
    """Pending rows per quarantine table (``late``, ``late_tracks``), as
    :func:`quarantine_backlog_by_partition` finds them, summed over partitions."""
    by_partition = quarantine_backlog_by_partition(root, pipeline)
    return {key: sum(counts.values()) for key, counts in by_partition.items()}


def recent_runs(root: str, pipeline: str, job: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
    """The pipeline's latest ``limit`` job runs from ``ops.runs`` (optionally of
    one ``job``, e.g. ``merge_late``), newest start first, each in its latest
    state: a run killed before it ended stays ``running``."""
    where = _of_pipeline(pipeline)
    if job is not None:
        where += f" AND job = {_sql_string(job)}"
    runs = _read(root, "ops", "runs", RUN_COLUMNS, where)
    if runs is None:
        return []
    # A run appends a `running` row when it starts and a final one, with the same
    # started_at and an ended_at, when it ends: newest start first, the final row
    # before the running one, and each run's first row is its latest state.
    ordered = runs.sort_by([("started_at", "descending"), ("ended_at", "descending", "at_end")])
    numbered = ordered.append_column("row", pa.array(range(ordered.num_rows), pa.int64()))
    firsts = numbered.group_by("run_id").aggregate([("row", "min")]).column("row_min")
    newest = pc.take(firsts, pc.sort_indices(firsts))[: max(limit, 0)]
    return ordered.take(newest).to_pylist()


def watermark_history(root: str, pipeline: str, limit: int = 500) -> list[dict[str, Any]]:
    """The pipeline's latest ``limit`` watermark steps from
    ``ops.watermark_history``, oldest first (for a chart of the watermark
    against processing time): batch id, watermark, processing time, active and
    idle partitions, on-time and late counts."""
    if limit <= 0:
        return []
    latest = judged_version(root, pipeline)
    # A judged version has one step or more (idleness steps reuse it), so the last
    # ``limit`` versions usually hold enough; read further back only when not.
    reach = limit
    while True:
        first = None if latest is None or latest - reach <= 0 else latest - reach
        history = _steps(root, pipeline, HISTORY_COLUMNS, first)
        if history is None:
            return []
        if first is None or history.num_rows >= limit:
            break
        reach *= 4
    # Batch ids are bronze versions; an idleness step reuses the last one, so
    # the step's moment orders first. Watermarks never go backwards: last tie-break.
    ordered = history.sort_by(
        [("processing_time", "ascending"), ("batch_id", "ascending"), ("watermark", "ascending")]
    )
    return ordered.slice(max(ordered.num_rows - limit, 0)).to_pylist()


def table_rows(root: str, layer: str, name: str) -> list[dict[str, Any]]:
    """Every row of a (small) table, such as a gold rollup; [] if it does not exist."""
    table = _open(root, layer, name)
    if table is None:
        return []
    return pa.table(table.scan()).to_pylist()


def as_utc(moment: datetime) -> datetime:
    """Delta timestamps are UTC instants; pyarrow may hand them over without a zone."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
