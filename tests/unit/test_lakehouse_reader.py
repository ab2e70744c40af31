"""The Spark-free lakehouse reader (plugins/tidemark_airflow/lakehouse.py) on
tables written by the real delta-spark: updates (remove actions), a checkpoint,
partition pruning, missing tables and the -inf/+inf watermark sentinels."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pyspark.sql.types import BooleanType, DoubleType, IntegerType, LongType, StringType, TimestampType
from tidemark_airflow import lakehouse

from spark_jobs.config import load_pipeline
from spark_jobs.lakehouse.create import create_if_missing
from spark_jobs.tables import TableRef, TableRegistry, tuning_table

PIPELINES = Path(__file__).resolve().parents[2] / "spark_jobs" / "pipelines"
MIN, MAX = lakehouse.MIN_WATERMARK, lakehouse.MAX_WATERMARK
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
LONG_JUDGED = 900
DEFAULTS = {
    StringType(): "x",
    LongType(): 0,
    IntegerType(): 0,
    DoubleType(): 0.0,
    BooleanType(): False,
    TimestampType(): T0,
}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def append(spark, table: TableRef, *rows: dict) -> None:
    """Rows given by the columns that matter; the others get a typed default
    (None where nullable)."""
    full = [
        tuple(
            row.get(field.name, None if field.nullable else DEFAULTS[field.dataType])
            for field in table.schema.fields
        )
        for row in rows
    ]
    spark.createDataFrame(full, table.schema).write.format("delta").mode("append").save(table.path)


def clock(pipeline: str, partition: str, watermark: int, **values) -> dict:
    return {"pipeline": pipeline, "source_partition": partition, "partition_watermark": watermark, **values}


def step(pipeline: str, batch_id: int, watermark: int, seconds: float, clocks: list | None = None) -> dict:
    return {
        "pipeline": pipeline,
        "batch_id": batch_id,
        "watermark": watermark,
        "processing_time": at(seconds),
        "partition_clocks": clocks,
    }


def recorded(partition: str, watermark: int, idle: bool = False, state: str | None = None) -> tuple:
    """A partition's clock as a step records it: partition, newest event (ms),
    watermark, last data (ms), idle, aligned, a custom generator's state."""
    return (partition, watermark + 1, watermark, 1_000, idle, True, state)


ADAPTIVE_STATE = '{"bound_ms": 5000}'


def run(
    pipeline: str, run_id: str, job: str, status: str, started: float, ended: float | None = None
) -> dict:
    return {
        "pipeline": pipeline,
        "run_id": run_id,
        "job": job,
        "status": status,
        "started_at": at(started),
        "ended_at": None if ended is None else at(ended),
        "rows_in": None if ended is None else 7,
    }


@pytest.fixture(scope="module")
def root(spark, tmp_path_factory) -> str:
    """A lakehouse with the shared ops tables, the telemetry quarantine tables,
    and a few rows of three pipelines."""
    root = str(tmp_path_factory.mktemp("lakehouse"))
    registry = TableRegistry(load_pipeline(PIPELINES / "telemetry.yaml"), root)
    ops = registry.ops
    for table in (*ops.values(), registry.quarantine, registry.late_tracks):
        create_if_missing(spark, table)

    watermarks = ops["watermarks"]
    # A checkpoint every other commit, so the reader must combine one with JSON commits.
    spark.sql(f"ALTER TABLE delta.`{watermarks.path}` SET TBLPROPERTIES ('delta.checkpointInterval' = '2')")
    append(
        spark,
        watermarks,
        clock(
            "telemetry", "0", 9_000, max_event_time=at(-50), last_data_at=at(30), is_aligned=True, batch_id=2
        ),
        clock("telemetry", "1", MIN, is_aligned=True, batch_id=2),
        clock("telemetry", "2", 7_000, is_aligned=True, batch_id=2),
        clock("telemetry", "10", 4_000, is_idle=True, is_aligned=False, batch_id=2),
        clock("flushed", "0", 5_000, is_aligned=True),
        clock("long", "0", 2_000, is_aligned=True, batch_id=LONG_JUDGED),
        clock("busy", "0", 4_000, is_aligned=True, batch_id=3),
        clock("moved", "0", 1_000, is_aligned=True, batch_id=4, updated_at=at(11)),
        # A custom generator's state, in the snapshot as in the step it holds.
        clock(
            "adaptive",
            "0",
            2_000,
            max_event_time=datetime.fromtimestamp(2.001, UTC),
            last_data_at=datetime.fromtimestamp(1, UTC),
            is_aligned=True,
            batch_id=4,
            updated_at=at(11),
            generator_state=ADAPTIVE_STATE,
        ),
    )
    for watermark in (9_500, 10_000):  # rewrites the partition's file: remove + add actions
        spark.sql(
            f"UPDATE delta.`{watermarks.path}` SET partition_watermark = {watermark} "
            "WHERE pipeline = 'telemetry' AND source_partition = '0'"
        )
    assert list(Path(watermarks.path, "_delta_log").glob("*.checkpoint.parquet"))

    append(
        spark,
        ops["watermark_history"],
        step("telemetry", 0, MIN, 0),
        step("telemetry", 1, 5_000, 10),
        step("telemetry", 2, 6_000, 20),
        step("telemetry", 2, 7_000, 30),  # an idleness step reuses the last batch id
        step("flushed", 0, 5_000, 10),
        step("flushed", 1, MAX, 20),  # --flush: end of input
        # A long-running pipeline: an early step, then the two last judged versions.
        # The early step's watermark is one no real history holds (above the
        # latest), so a reader that looked at it would show it.
        step("long", 5, 99_000, 5),
        step("long", LONG_JUDGED - 1, 1_000, 900),
        step("long", LONG_JUDGED, 2_000, 910),
        # A batch at work: its history row committed, its windows and clocks not yet.
        step("busy", 3, 4_000, 10),
        step("busy", 4, 8_000, 20),
        # Clocks recorded in the history after the snapshot (version 4) was written;
        # the last is an idleness step planned on version 5 that committed after 6.
        step("moved", 4, 1_000, 10, [recorded("0", 1_000)]),
        step("moved", 6, 3_000, 20, [recorded("0", 3_000), recorded("1", 2_500, idle=True)]),
        step("moved", 5, 2_000, 30, [recorded("0", 2_000, idle=True)]),
        step("adaptive", 4, 2_000, 10, [recorded("0", 2_000, state=ADAPTIVE_STATE)]),
    )
    append(
        spark,
        ops["runs"],
        run("telemetry", "a", "merge_late", "running", 10),
        run("telemetry", "a", "merge_late", "succeeded", 10, 15),
        run("telemetry", "b", "merge_late", "running", 20),  # killed: never ended
        run("telemetry", "c", "silver", "running", 30),
        run("telemetry", "c", "silver", "succeeded", 30, 40),
        run("flushed", "d", "merge_late", "succeeded", 50, 55),
    )
    late = [("0", "pending"), ("0", "pending"), ("10", "pending"), ("2", "merged"), ("0", "merged")]
    append(
        spark,
        registry.quarantine,
        *({"source_partition": partition, "status": status} for partition, status in late),
    )
    append(spark, registry.late_tracks, {"source_partition": "2", "status": "pending"})
    tuning = tuning_table(root)
    create_if_missing(spark, tuning)
    append(
        spark,
        tuning,
        *(
            {
                "pipeline": "telemetry",
                "run_id": run,
                "tuned_at": at(moment),
                "history": "bronze",
                "candidate": c,
            }
            for run, moment, candidates in (("old", 10, ["1s", "2s"]), ("new", 20, ["5s", "30s"]))
            for c in candidates
        ),
        {
            "pipeline": "flushed",
            "run_id": "other",
            "tuned_at": at(30),
            "history": "bronze",
            "candidate": "9s",
        },
    )
    return root


@pytest.mark.spark
def test_the_pipeline_watermark_is_the_highest_history_step(root):
    assert lakehouse.pipeline_watermark(root, "telemetry") == 7_000
    assert lakehouse.pipeline_watermark(root, "flushed") == MAX
    assert lakehouse.pipeline_watermark(root, "unknown") is None


@pytest.mark.spark
def test_the_pipeline_watermark_is_read_from_the_last_judged_versions_step_on(root):
    assert lakehouse.pipeline_watermark(root, "long") == 2_000


@pytest.mark.spark
def test_the_pipeline_watermark_leaves_out_the_steps_of_a_batch_still_at_work(root):
    assert lakehouse.pipeline_watermark(root, "busy") == 4_000


@pytest.mark.spark
def test_partition_clocks_are_the_latest_rows_in_partition_order_with_their_lag(root):
    clocks = lakehouse.partition_clocks(root, "telemetry")
    assert [c["source_partition"] for c in clocks] == ["0", "1", "2", "10"]
    by_partition = {c["source_partition"]: c for c in clocks}
    assert by_partition["0"]["partition_watermark"] == 10_000  # after both updates
    assert by_partition["0"]["lag_ms"] == -3_000  # ahead of the pipeline
    assert by_partition["2"]["lag_ms"] == 0  # holds the pipeline's watermark
    assert by_partition["10"]["lag_ms"] == 3_000  # idle, behind
    assert by_partition["1"]["partition_watermark"] == MIN and by_partition["1"]["lag_ms"] is None
    assert by_partition["10"]["is_idle"] and not by_partition["10"]["is_aligned"]
    assert by_partition["0"]["max_event_time"] == at(-50)
    assert by_partition["0"]["last_data_at"] == at(30)
    assert by_partition["1"]["max_event_time"] is None
    assert set(clocks[0]) == {*lakehouse.CLOCK_COLUMNS, "lag_ms"}


@pytest.mark.spark
def test_clocks_recorded_after_the_snapshot_are_the_newest_steps_by_batch_then_moment(root):
    assert lakehouse.judged_version(root, "moved") == 6
    assert lakehouse.pipeline_watermark(root, "moved") == 3_000
    clocks = lakehouse.partition_clocks(root, "moved")
    assert [(c["source_partition"], c["partition_watermark"], c["is_idle"], c["lag_ms"]) for c in clocks] == [
        ("0", 3_000, False, 0),
        ("1", 2_500, True, 500),
    ]
    assert clocks[1]["max_event_time"] == datetime.fromtimestamp(2.501, UTC)
    assert {c["updated_at"] for c in clocks} == {at(20)}


@pytest.mark.spark
def test_a_snapshot_holding_a_custom_generators_state_is_current_not_stale(root):
    [clock] = lakehouse.partition_clocks(root, "adaptive")
    assert clock["partition_watermark"] == 2_000
    assert clock["updated_at"] == at(11)  # the snapshot's own moment, not the step's


@pytest.mark.spark
def test_the_latest_tuning_is_the_pipelines_newest_saved_run(root):
    assert [row["candidate"] for row in lakehouse.latest_tuning(root, "telemetry")] == ["5s", "30s"]
    assert lakehouse.latest_tuning(root, "busy") == []


@pytest.mark.spark
def test_no_lag_against_an_infinite_pipeline_watermark(root):
    [flushed] = lakehouse.partition_clocks(root, "flushed")
    assert flushed["partition_watermark"] == 5_000 and flushed["lag_ms"] is None


@pytest.mark.spark
def test_quarantine_backlog_counts_pending_rows_only(root):
    assert lakehouse.quarantine_backlog(root, "telemetry") == {"late": 3, "late_tracks": 1}
    assert lakehouse.quarantine_backlog_by_partition(root, "telemetry") == {
        "late": {"0": 2, "10": 1},
        "late_tracks": {"2": 1},
    }


@pytest.mark.spark
def test_recent_runs_latest_state_per_run_newest_first(root):
    runs = lakehouse.recent_runs(root, "telemetry")
    assert [(r["run_id"], r["status"]) for r in runs] == [
        ("c", "succeeded"),
        ("b", "running"),
        ("a", "succeeded"),
    ]
    assert runs[0]["ended_at"] == at(40) and runs[2]["rows_in"] == 7
    merges = lakehouse.recent_runs(root, "telemetry", job="merge_late")
    assert [(r["run_id"], r["status"]) for r in merges] == [("b", "running"), ("a", "succeeded")]
    assert [r["run_id"] for r in lakehouse.recent_runs(root, "telemetry", limit=1)] == ["c"]
    assert lakehouse.recent_runs(root, "telemetry", job="gold") == []


@pytest.mark.spark
def test_watermark_history_is_the_latest_steps_in_processing_order(root):
    history = lakehouse.watermark_history(root, "telemetry")
    assert [(h["batch_id"], h["watermark"]) for h in history] == [
        (0, MIN),
        (1, 5_000),
        (2, 6_000),
        (2, 7_000),
    ]
    assert history[-1]["processing_time"] == at(30)
    assert {"active_partitions", "idle_partitions", "on_time_count", "late_count"} <= set(history[0])
    assert [h["watermark"] for h in lakehouse.watermark_history(root, "telemetry", limit=2)] == [6_000, 7_000]
    assert [h["watermark"] for h in lakehouse.watermark_history(root, "flushed")] == [5_000, MAX]


@pytest.mark.spark
def test_watermark_history_reads_the_last_versions_and_further_back_only_when_they_hold_too_few_steps(root):
    assert [h["watermark"] for h in lakehouse.watermark_history(root, "long", limit=2)] == [1_000, 2_000]
    assert [h["watermark"] for h in lakehouse.watermark_history(root, "long", limit=3)] == [
        99_000,
        1_000,
        2_000,
    ]


@pytest.mark.spark
def test_a_pipeline_without_rows_or_tables_reads_as_empty(root):
    # `flushed` has rows in the ops tables but no quarantine tables at all.
    assert lakehouse.quarantine_backlog(root, "flushed") == {}
    assert lakehouse.partition_clocks(root, "unknown") == []
    assert lakehouse.recent_runs(root, "unknown") == []
    assert lakehouse.watermark_history(root, "unknown") == []


def test_a_lakehouse_without_tables_reads_as_empty(tmp_path):
    root = str(tmp_path / "nothing-here")
    assert lakehouse.pipeline_watermark(root, "telemetry") is None
    assert lakehouse.partition_clocks(root, "telemetry") == []
    assert lakehouse.quarantine_backlog(root, "telemetry") == {}
    assert lakehouse.quarantine_backlog_by_partition(root, "telemetry") == {}
    assert lakehouse.recent_runs(root, "telemetry") == []
    assert lakehouse.watermark_history(root, "telemetry") == []


def test_finite_watermarks_exclude_the_sentinels():
    assert lakehouse.is_finite(0) and lakehouse.is_finite(MIN + 1) and lakehouse.is_finite(MAX - 1)
    assert not lakehouse.is_finite(MIN) and not lakehouse.is_finite(MAX) and not lakehouse.is_finite(None)


@pytest.mark.spark
def test_pipeline_names_cannot_escape_the_predicate(root):
    assert lakehouse.recent_runs(root, "x' OR '1'='1") == []
    assert lakehouse.partition_clocks(root, "telemetry' OR pipeline = 'flushed") == []
