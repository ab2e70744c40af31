"""Read the lakehouse's ops and quarantine tables without Spark.

Airflow's api-server, sensors and workers poll these tables often; a JVM per
poll would cost a JVM's start-up and memory. delta-rs (the ``deltalake`` package)
reads the Delta log (checkpoints, JSON commits, deletion vectors) and the
Parquet files directly, pruning files by partition (``pipeline``, ``status``)
before reading them.

Tables on object storage (``s3a://``) are reached as Spark's sessions reach them
(:func:`spark_jobs.object_store.deltalake_storage_options`).

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

from spark_jobs.eventtime.clock_log import ClockState, clock_state, snapshot_version
from spark_jobs.object_store import deltalake_storage_options

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
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


def lag_ms(pipeline_watermark: int | None, partition_watermark: int | None) -> int | None:
    """How far a partition's watermark trails the pipeline's: 0 for the partition
    that holds it, negative for one ahead, positive for one behind (idle or catching
    up); None unless both are finite."""
    if is_finite(pipeline_watermark) and is_finite(partition_watermark):
        return pipeline_watermark - partition_watermark
    return None


def _sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _open(root: str, layer: str, name: str) -> DeltaTable | None:
    try:
        path = f"{root.rstrip('/')}/{layer}/{name}"
        return DeltaTable(path, storage_options=deltalake_storage_options(path))
    except TableNotFoundError:
        return None


def _read(root: str, layer: str, name: str, columns: list[str], where: str) -> pa.Table | None:
    """``columns`` of the rows matching the SQL predicate ``where``; None if no table."""
    return _scan(_open(root, layer, name), columns, where)


def _has_column(table: DeltaTable | None, column: str) -> bool:
    return table is not None and column in table.schema().to_arrow().names


def _scan(table: DeltaTable | None, columns: list[str], where: str) -> pa.Table | None:
    """:func:`_read` of a table already open (None: no table)."""
    if table is None:
        return None
    # scan() runs delta-rs's own engine, which prunes partitions and applies
    # deletion vectors; the pyarrow dataset path refuses tables that have them.
    read = pa.table(table.scan(columns=columns, predicate=where))
    # The engine returns strings as string_view, which pyarrow's take() and sorts lack.
    return read.cast(pa.schema(_plain(field) for field in read.schema))


def _plain(field: pa.Field) -> pa.Field:
    return field.with_type(_plain_type(field.type))


def _plain_type(kind: pa.DataType) -> pa.DataType:
    """``kind`` with every string_view (nested ones too) as a plain string."""
    if pa.types.is_string_view(kind):
        return pa.string()
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_list_view(kind):
        return pa.list_(_plain(kind.value_field))
    if pa.types.is_struct(kind):
        return pa.struct([_plain(kind.field(index)) for index in range(kind.num_fields)])
    return kind


def _of_pipeline(pipeline: str) -> str:
    return f"pipeline = {_sql_string(pipeline)}"


def _millis(moment: datetime | None) -> int | None:
    return None if moment is None else round(moment.timestamp() * 1000)


def _moment(millis: int | None) -> datetime | None:
    return None if millis is None else datetime.fromtimestamp(millis / 1000, UTC)


def _clock(root: str, pipeline: str) -> tuple[ClockState, dict[str, dict[str, Any]]]:
    """The pipeline clock by the engine's rule (``spark_jobs.eventtime.clock_log``): the
    ``ops.watermarks`` snapshot and the ``ops.watermark_history`` steps from its
    version on (delta-rs skips the files of older steps by their statistics, so a page
    load or a sensor's poke does not read the whole history). Also the snapshot's rows
    by partition."""
    watermarks = _open(root, "ops", "watermarks")
    # A custom generator's state is part of the clock (written since custom generators exist).
    stateful = _has_column(watermarks, "generator_state")
    columns = [*CLOCK_COLUMNS, "batch_id", *(["generator_state"] if stateful else [])]
    clocks = _scan(watermarks, columns, _of_pipeline(pipeline))
    snapshot = [] if clocks is None else clocks.to_pylist()
    for row in snapshot:
        row["max_event_ms"], row["last_data_ms"] = (
            _millis(row["max_event_time"]),
            _millis(row["last_data_at"]),
        )
    history = _open(root, "ops", "watermark_history")
    with_clocks = _has_column(history, "partition_clocks")
    columns = ["batch_id", "watermark", "processing_time", *(["partition_clocks"] if with_clocks else [])]
    steps = _steps(history, pipeline, columns, snapshot_version(snapshot))
    rows = [] if steps is None else steps.to_pylist()
    for row in rows:
        row["processing_ms"] = _millis(row["processing_time"])
        row.setdefault("partition_clocks", None)
    return clock_state(snapshot, rows), {row["source_partition"]: row for row in snapshot}


def judged_version(root: str, pipeline: str) -> int | None:
    """The last bronze version silver judged, or None before its first batch."""
    return _clock(root, pipeline)[0].judged_version


def _steps(
    history: DeltaTable | None, pipeline: str, columns: list[str], first_batch: int | None
) -> pa.Table | None:
    """The pipeline's steps in ``ops.watermark_history`` (open) from batch ``first_batch``
    on (all when None): delta-rs skips the files of older steps by their statistics."""
    where = _of_pipeline(pipeline)
    if first_batch is not None:
        where += f" AND batch_id >= {first_batch:d}"
    return _scan(history, columns, where)


def pipeline_watermark(root: str, pipeline: str) -> int | None:
    """The pipeline's combined watermark, or None before its first step. Steps of a
    batch still at work are not part of it (a sensor that believed them would read
    windows not yet fired); the end of input (+inf) is final."""
    return _clock(root, pipeline)[0].watermark


def _partition_order(name: str) -> tuple[bool, int, str]:
    # Kafka and file partitions are numbers kept as strings: 2 before 10.
    return (not name.isdigit(), int(name) if name.isdigit() else 0, name)


def partition_clocks(root: str, pipeline: str) -> list[dict[str, Any]]:
    """One row per source partition (its watermark, newest event time, idle and
    aligned flags, last data and update times), in partition order, each with
    ``lag_ms`` = pipeline watermark - partition watermark when both are finite (else
    None): 0 for the partition that holds the pipeline's watermark, negative for
    active ones ahead of it, positive for idle or catching-up ones behind it."""
    state, snapshot = _clock(root, pipeline)
    rows = []
    for clock in state.partitions:
        held = snapshot.get(str(clock.partition))
        updated = _moment(state.recorded_ms) if held is None or state.snapshot_stale else held["updated_at"]
        own = clock.watermark
        rows.append(
            {
                "source_partition": str(clock.partition),
                "partition_watermark": own,
                "max_event_time": _moment(clock.max_timestamp),
                "is_idle": clock.is_idle,
                "is_aligned": clock.is_aligned,
                "last_data_at": _moment(clock.last_data_at),
                "updated_at": updated,
                "lag_ms": lag_ms(state.watermark, own),
            }
        )
    return sorted(rows, key=lambda row: _partition_order(row["source_partition"]))


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
    return backlog_totals(quarantine_backlog_by_partition(root, pipeline))


def backlog_totals(by_partition: dict[str, dict[str, int]]) -> dict[str, int]:
    """A backlog by table and partition (:func:`quarantine_backlog_by_partition`), summed over partitions."""
    return {key: sum(counts.values()) for key, counts in by_partition.items()}


def pending_late(backlog: dict[str, int]) -> int:
    """The late records a backlog (:func:`quarantine_backlog`) stands for: with offline
    detection a late record is a late track as well, so the larger of the two."""
    return max(backlog.values(), default=0)


def recent_runs(
    root: str, pipeline: str, job: str | None = None, limit: int | None = 20
) -> list[dict[str, Any]]:
    """The pipeline's latest ``limit`` (None: all) job runs from ``ops.runs`` (optionally of
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
    newest = pc.take(firsts, pc.sort_indices(firsts))[: None if limit is None else max(limit, 0)]
    return ordered.take(newest).to_pylist()


def watermark_history(root: str, pipeline: str, limit: int = 500) -> list[dict[str, Any]]:
    """The pipeline's latest ``limit`` watermark steps from
    ``ops.watermark_history``, oldest first (for charts against processing time):
    batch id, watermark, processing time, active and idle partitions, on-time and
    late counts, and ``partition_clocks``: on a batch's last step, every partition's
    clock after it (a list of mappings), else None."""
    if limit <= 0:
        return []
    latest = judged_version(root, pipeline)
    table = _open(root, "ops", "watermark_history")
    columns = [*HISTORY_COLUMNS, *(["partition_clocks"] if _has_column(table, "partition_clocks") else [])]
    # A judged version has one step or more (idleness steps reuse it), so the last
    # ``limit`` versions usually hold enough; read further back only when not.
    reach = limit
    while True:
        first = None if latest is None or latest - reach <= 0 else latest - reach
        history = _steps(table, pipeline, columns, first)
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
    rows = ordered.slice(max(ordered.num_rows - limit, 0)).to_pylist()
    for row in rows:
        row.setdefault("partition_clocks", None)
    return rows


def rejects_by_reason(root: str, pipeline: str, since: datetime) -> dict[str, int]:
    """How many of the pipeline's records bronze rejected since ``since``, per
    reason, most first (delta-rs skips older files by their statistics)."""
    moment = as_utc(since).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    where = _of_pipeline(pipeline) + f" AND rejected_at >= {_sql_string(moment)}"
    rejects = _read(root, "ops", "rejects", ["reason"], where)
    if rejects is None:
        return {}
    counts = pc.value_counts(rejects.column("reason")).to_pylist()
    return {count["values"]: count["counts"] for count in sorted(counts, key=lambda c: -c["counts"])}


TUNING_COLUMNS = [
    "run_id",
    "tuned_at",
    "history",
    "candidate",
    "late_share",
    "late_pairs",
    "delay_event_p50_ms",
]


def latest_tuning(root: str, pipeline: str) -> list[dict[str, Any]]:
    """The candidates of the pipeline's newest ``tidemark tune --save`` run in
    ``ops.tuning`` (in the order given), or [] when it was never tuned."""
    runs = _read(root, "ops", "tuning", TUNING_COLUMNS, _of_pipeline(pipeline))
    if runs is None or runs.num_rows == 0:
        return []
    rows = runs.to_pylist()
    newest = max(rows, key=lambda row: row["tuned_at"])["run_id"]
    return [row for row in rows if row["run_id"] == newest]


def latest_runs(root: str, pipeline: str, jobs: list[str]) -> dict[str, dict[str, Any]]:
    """Each of ``jobs``'s newest run (:func:`recent_runs`, newest first), for those that ran."""
    latest: dict[str, dict[str, Any]] = {}
    for run in recent_runs(root, pipeline, limit=None):
        if run["job"] in jobs:
            latest.setdefault(run["job"], run)
    return latest


def table_rows(root: str, layer: str, name: str) -> list[dict[str, Any]]:
    """Every row of a (small) table, such as a gold rollup; [] if it does not exist."""
    table = _open(root, layer, name)
    if table is None:
        return []
    return pa.table(table.scan()).to_pylist()


def as_utc(moment: datetime) -> datetime:
    """Delta timestamps are UTC instants; pyarrow may hand them over without a zone."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
