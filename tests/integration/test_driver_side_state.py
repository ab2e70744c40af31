"""What the jobs keep and build on the driver between Spark jobs: rows made in the
JVM from driver-side values, the log check that tells a writer whether the
clock it keeps in memory is still the table's, and the one that tells a stream
whether its batch already landed."""

from __future__ import annotations

import json
import time
from datetime import UTC, date, datetime
from zoneinfo import ZoneInfo

import pytest
from pyspark.sql.types import ArrayType, StructField, StructType

from spark_jobs.engine import watermark_steps
from spark_jobs.engine.clocks import (
    VersionClock,
    append_batch_history,
    load_clock,
    utc_moment,
    write_partition_clocks,
)
from spark_jobs.engine.watermark_steps import flush
from spark_jobs.eventtime.clock import MAX_WATERMARK, MIN_WATERMARK
from spark_jobs.eventtime.tracker import PartitionSnapshot, WatermarkTracker
from spark_jobs.lakehouse.create import create_missing
from spark_jobs.lakehouse.log import (
    CLOCK_SKEW_MS,
    batch_landed,
    batch_metadata,
    changed_by_others,
    table_version,
)
from spark_jobs.sql import local_rows
from spark_jobs.tables import PARTITION_CLOCKS_TYPE
from tests.integration.conftest import registry_for, write_pipeline

pytestmark = pytest.mark.spark

CLOCKS = "pipeline string, source_partition string, watermark long"
OWN = frozenset({"silver-query:watermarks"})
PIPELINE = ("pipeline", frozenset({"p1"}))


def test_local_rows_hold_the_values_and_types_create_dataframe_gives(spark):
    schema = "name string, at timestamp, day date, ratio double, flag boolean, count long, tiny int"
    rows = [
        ("a", datetime(2026, 1, 1, 0, 0, 0, 123456, tzinfo=UTC), date(2026, 2, 28), 1.5, True, 2**40, 7),
        (None, None, None, float("inf"), None, None, None),
        (
            'é "quoted" \\ text',
            datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
            date(1969, 12, 31),
            -0.1,
            False,
            -1,
            0,
        ),
    ]
    made = local_rows(spark, rows, schema)
    expected = spark.createDataFrame(rows, schema)
    assert made.schema.simpleString() == expected.schema.simpleString()
    assert made.collect() == expected.collect()


@pytest.fixture
def new_york_time(monkeypatch):
    """This process's local time zone set to New York (the machines run in UTC)."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_local_rows_read_a_naive_datetime_in_local_time_as_create_dataframe_does(spark, new_york_time):
    naive = datetime(2026, 3, 1, 12, 30)
    made = local_rows(spark, [(naive,)], "at timestamp").selectExpr("unix_millis(at)").first()[0]
    expected = spark.createDataFrame([(naive,)], "at timestamp").selectExpr("unix_millis(at)").first()[0]
    assert made == expected == int(naive.replace(tzinfo=ZoneInfo("America/New_York")).timestamp() * 1000)


def test_local_rows_refuse_a_value_of_the_wrong_type(spark):
    with pytest.raises(Exception, match=r"(?i)malformed|parse|FAILFAST"):
        local_rows(spark, [("not a number",)], "count long").collect()


def test_local_rows_of_nothing_are_an_empty_frame_with_the_schema(spark):
    made = local_rows(spark, [], "name string, count long")
    assert made.collect() == []
    assert made.schema.simpleString() == "struct<name:string,count:bigint>"


def test_local_rows_are_one_partition_so_a_write_or_broadcast_of_them_runs_one_task(spark):
    # Spark's default splits them over every core: tasks with nothing to do.
    made = local_rows(spark, [("p1", "0", 1), ("p2", "0", 1)], CLOCKS)
    assert made.rdd.getNumPartitions() == 1
    assert sorted(made.collect()) == [("p1", "0", 1), ("p2", "0", 1)]


def clocks_table(spark, tmp_path) -> str:
    path = str(tmp_path / "watermarks")
    local_rows(spark, [("p1", "0", 1), ("p2", "0", 1)], CLOCKS).write.format("delta").partitionBy(
        "pipeline"
    ).save(path)
    return path


def append(spark, path: str, pipeline: str, app_id: str | None = None, label: str | None = None) -> None:
    writer = local_rows(spark, [(pipeline, "1", 2)], CLOCKS).write.format("delta").mode("append")
    if app_id is not None:
        writer = writer.option("txnAppId", app_id).option("txnVersion", table_version(spark, path))
    if label is not None:
        writer = writer.option("userMetadata", label)
    writer.save(path)


def test_a_writers_own_commits_leave_its_memory_current(spark, tmp_path):
    path = clocks_table(spark, tmp_path)
    seen = table_version(spark, path)
    append(spark, path, "p1", "silver-query:watermarks")
    assert not changed_by_others(spark, path, seen, table_version(spark, path), PIPELINE, OWN)


def test_a_writers_own_labelled_commits_leave_its_memory_current(spark, tmp_path):
    path = clocks_table(spark, tmp_path)
    seen = table_version(spark, path)
    append(spark, path, "p1", label="silver-query:watermarks")
    assert not changed_by_others(spark, path, seen, table_version(spark, path), PIPELINE, OWN)


def test_another_writers_labelled_commit_invalidates_the_memory(spark, tmp_path):
    path = clocks_table(spark, tmp_path)
    seen = table_version(spark, path)
    append(spark, path, "p1", label="merge-run-7")
    assert changed_by_others(spark, path, seen, table_version(spark, path), PIPELINE, OWN)


def test_another_writers_commit_to_the_pipeline_invalidates_the_memory(spark, tmp_path):
    path = clocks_table(spark, tmp_path)
    seen = table_version(spark, path)
    append(spark, path, "p1", "silver-query:watermarks")
    append(spark, path, "p1", "idle-p1:watermarks")
    assert changed_by_others(spark, path, seen, table_version(spark, path), PIPELINE, OWN)


def test_a_commit_without_a_transaction_invalidates_the_memory(spark, tmp_path):
    path = clocks_table(spark, tmp_path)
    seen = table_version(spark, path)
    append(spark, path, "p1")
    assert changed_by_others(spark, path, seen, table_version(spark, path), PIPELINE, OWN)


def test_another_pipelines_commits_leave_the_memory_current(spark, tmp_path):
    path = clocks_table(spark, tmp_path)
    seen = table_version(spark, path)
    append(spark, path, "p2", "idle-p2:watermarks")
    append(spark, path, "p2")
    assert not changed_by_others(spark, path, seen, table_version(spark, path), PIPELINE, OWN)


def test_a_changed_table_definition_invalidates_the_memory(spark, tmp_path):
    path = clocks_table(spark, tmp_path)
    seen = table_version(spark, path)
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.logRetentionDuration' = '30 days')")
    assert changed_by_others(spark, path, seen, table_version(spark, path), PIPELINE, OWN)


def test_nothing_committed_since_leaves_the_memory_current(spark, tmp_path):
    path = clocks_table(spark, tmp_path)
    version = table_version(spark, path)
    assert not changed_by_others(spark, path, version, version, PIPELINE, OWN)


def test_a_log_that_lost_a_commit_cannot_vouch_for_the_memory(spark, tmp_path):
    path = clocks_table(spark, tmp_path)
    seen = table_version(spark, path)
    append(spark, path, "p1", "silver-query:watermarks")
    append(spark, path, "p1", "silver-query:watermarks")
    until = table_version(spark, path)
    (tmp_path / "watermarks" / "_delta_log" / f"{seen + 1:020d}.json").unlink()
    assert changed_by_others(spark, path, seen, until, PIPELINE, OWN)


def test_a_table_younger_than_the_memory_invalidates_it(spark, tmp_path):
    path = clocks_table(spark, tmp_path)
    assert changed_by_others(
        spark, path, table_version(spark, path) + 3, table_version(spark, path), PIPELINE, OWN
    )


def test_a_new_lakehouses_clock_is_known_from_the_log_without_a_spark_job(spark, tmp_path):
    registry = registry_for(write_pipeline(tmp_path), tmp_path / "lakehouse")
    create_missing(spark, registry)
    context = spark.sparkContext
    context.setJobGroup("new-clock", "the clock of a new lakehouse")
    try:
        saved = load_clock(spark, registry)
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    assert list(context.statusTracker().getJobIdsForGroup("new-clock")) == []
    assert saved.tracker.watermark == MIN_WATERMARK
    assert list(saved.tracker.snapshots()) == []
    assert saved.judged_version is None


def test_a_clock_whose_only_step_is_the_end_of_input_is_read_from_the_history(spark, tmp_path):
    registry = registry_for(write_pipeline(tmp_path), tmp_path / "lakehouse")
    create_missing(spark, registry)
    assert flush(spark, registry)
    # The history holds the step; the partition clocks table was never written.
    assert load_clock(spark, registry).tracker.watermark == MAX_WATERMARK


def tracker_with(registry, *clocks: PartitionSnapshot) -> WatermarkTracker:
    tracker = WatermarkTracker(registry.config.watermark, min(clock.watermark for clock in clocks))
    for clock in clocks:
        tracker.restore(clock)
    return tracker


# A batch that judged versions 4 and 5 of bronze, and the clocks after it.
PLAN = [VersionClock(4, 1_000, MIN_WATERMARK, 100, 1, 0), VersionClock(5, 2_000, 100, 200, 1, 0)]
AFTER = PartitionSnapshot("0", 201, 200, 2_000, False, True)


def history_clocks(spark, registry) -> list[tuple]:
    history = spark.read.format("delta").load(registry.ops["watermark_history"].path)
    rows = history.select("batch_id", "watermark", "on_time_count", "late_count", "partition_clocks")
    return sorted(
        (*row[:-1], None if row[-1] is None else [tuple(c) for c in row[-1]]) for row in rows.collect()
    )


def test_a_batchs_history_is_its_clock_commit_its_last_row_carrying_the_partition_clocks(spark, tmp_path):
    registry = registry_for(write_pipeline(tmp_path), tmp_path / "lakehouse")
    create_missing(spark, registry)
    append_batch_history(
        spark, registry, PLAN, {4: (3, 0), 5: (1, 2)}, tracker_with(registry, AFTER), "q:history"
    )
    assert history_clocks(spark, registry) == [
        (4, 100, 3, 0, None),
        (5, 200, 1, 2, [("0", 201, 200, 2_000, False, True, None)]),
    ]
    saved = load_clock(spark, registry)  # ops.watermarks was never written
    assert saved.judged_version == 5
    assert saved.tracker.watermark == 200
    assert saved.tracker.snapshots() == [AFTER]
    assert saved.snapshot_stale


def test_the_clock_is_the_snapshot_brought_forward_by_the_steps_recorded_since_it(spark, tmp_path):
    registry = registry_for(write_pipeline(tmp_path), tmp_path / "lakehouse")
    create_missing(spark, registry)
    before = PartitionSnapshot("0", 51, 50, 500, False, True)
    now = datetime.now(UTC)
    write_partition_clocks(spark, registry, tracker_with(registry, before), 3, ("q:watermarks", 0), now)
    assert load_clock(spark, registry).tracker.snapshots() == [before]
    append_batch_history(spark, registry, PLAN, {}, tracker_with(registry, AFTER), "q:history")
    saved = load_clock(spark, registry)
    assert (saved.judged_version, saved.tracker.snapshots(), saved.snapshot_stale) == (5, [AFTER], True)
    write_partition_clocks(spark, registry, saved.tracker, 5, ("q:watermarks", 1), now)
    assert load_clock(spark, registry).snapshot_stale is False


def test_a_history_written_before_partition_clocks_existed_is_read_and_gains_the_column(spark, tmp_path):
    registry = registry_for(write_pipeline(tmp_path), tmp_path / "lakehouse")
    history = registry.ops["watermark_history"]
    old_schema = StructType([field for field in history.schema.fields if field.name != "partition_clocks"])
    name = registry.config.name
    step = (name, 3, 50, 1, 0, 2, 0, datetime(2026, 1, 1, tzinfo=UTC))
    spark.createDataFrame([step], old_schema).write.format("delta").save(history.path)
    create_missing(spark, registry)  # every other table
    before = PartitionSnapshot("0", 51, 50, 500, False, True)
    write_partition_clocks(
        spark, registry, tracker_with(registry, before), 3, ("q:watermarks", 0), datetime.now(UTC)
    )
    saved = load_clock(spark, registry)
    assert (saved.judged_version, saved.tracker.watermark, saved.tracker.snapshots()) == (3, 50, [before])
    append_batch_history(spark, registry, PLAN, {}, tracker_with(registry, AFTER), "q:history")
    assert load_clock(spark, registry).tracker.snapshots() == [AFTER]


@pytest.mark.parametrize("never_back", [False, True], ids=["silver's replace", "an idleness step's merge"])
def test_clocks_written_before_generator_state_existed_are_read_and_gain_it(spark, tmp_path, never_back):
    pipeline = write_pipeline(
        tmp_path, watermark={"strategy": "custom", "generator": "tests.unit.user_generators:ShrinkingBound"}
    )
    registry = registry_for(pipeline, tmp_path / "lakehouse")
    history, watermarks = registry.ops["watermark_history"], registry.ops["watermarks"]
    old_clock = ArrayType(
        StructType([f for f in PARTITION_CLOCKS_TYPE.elementType.fields if f.name != "generator_state"])
    )
    old_history = StructType(
        [StructField(f.name, old_clock) if f.name == "partition_clocks" else f for f in history.schema.fields]
    )
    old_watermarks = StructType([f for f in watermarks.schema.fields if f.name != "generator_state"])
    name, moment = registry.config.name, datetime(2026, 1, 1, tzinfo=UTC)
    step = (name, 3, 50, 1, 0, 2, 0, moment, [("0", 51, 50, 500, False, True)])
    clock = (name, "0", utc_moment(51), 50, False, True, utc_moment(500), 3, moment)
    for table, schema, row in ((history, old_history, step), (watermarks, old_watermarks, clock)):
        # Created, then written, as the jobs of that time did.
        spark.createDataFrame([], schema).write.format("delta").save(table.path)
        spark.createDataFrame([row], schema).write.format("delta").mode("append").save(table.path)
    create_missing(spark, registry)  # every other table
    saved = load_clock(spark, registry)
    # Clocks recorded before the generator: it starts afresh, with no state until its first batch.
    assert saved.tracker.snapshots() == [PartitionSnapshot("0", 51, 50, 500, False, True)]
    assert not saved.snapshot_stale

    state = json.dumps({"generator": "tests.unit.user_generators:ShrinkingBound", "state": {"bound": 4000}})
    stateful = PartitionSnapshot("0", 201, 200, 2_000, False, True, state)
    append_batch_history(spark, registry, PLAN, {}, tracker_with(registry, stateful), "q:history")
    assert load_clock(spark, registry).tracker.snapshots() == [stateful]
    write_partition_clocks(
        spark, registry, tracker_with(registry, stateful), 5, ("q:watermarks", 0), moment, never_back
    )
    states = spark.read.format("delta").load(watermarks.path).select("generator_state").collect()
    assert [row.generator_state for row in states] == [state]
    saved = load_clock(spark, registry)
    assert saved.tracker.snapshots() == [stateful] and not saved.snapshot_stale
    assert saved.tracker.generators["0"].custom.bound == 4_000


def test_an_idleness_step_holds_the_clocks_after_a_batch_stamped_by_a_clock_ahead_of_its_own(spark, tmp_path):
    pipeline = write_pipeline(
        tmp_path, watermark={"strategy": "bounded", "max_out_of_orderness": "0s", "idleness": "1ms"}
    )
    registry = registry_for(pipeline, tmp_path / "lakehouse")
    create_missing(spark, registry)
    now = datetime.now(UTC)
    ahead_ms = int(now.timestamp() * 1000) + 3_600_000  # bronze's host an hour ahead of this one
    batch = [VersionClock(5, ahead_ms, MIN_WATERMARK, 200, 2, 0)]
    quiet = [
        PartitionSnapshot("0", 201, 200, 1_000, False, True),
        PartitionSnapshot("1", 301, 300, 1_000, False, True),
    ]
    append_batch_history(spark, registry, batch, {5: (2, 0)}, tracker_with(registry, *quiet), "q:history")

    step = watermark_steps.advance_idle(spark, registry, now)
    assert step is not None and step.watermark_after == 300  # both idle: the highest partition watermark
    saved = load_clock(spark, registry)
    assert saved.judged_version == 5
    assert [clock.is_idle for clock in saved.tracker.snapshots()] == [True, True]
    assert saved.tracker.watermark == 300


def append_labelled(spark, path: str, app_id: str, batch_id: int) -> None:
    label = batch_metadata(app_id, batch_id, {"other": 1})
    rows = spark.createDataFrame([(app_id, batch_id)], "app string, batch long")
    rows.write.format("delta").mode("append").option("userMetadata", label).save(path)


def append_plain(spark, path: str) -> None:
    spark.createDataFrame([("other", -1)], "app string, batch long").write.format("delta").mode(
        "append"
    ).save(path)


def test_a_labelled_batch_is_found_landed_past_other_writers_commits(spark, tmp_path):
    path = str(tmp_path / "t")
    born = int(time.time() * 1000)
    append_labelled(spark, path, "a", 4)
    append_labelled(spark, path, "b", 9)
    append_plain(spark, path)
    assert batch_landed(spark, path, "a", 4, born)
    assert not batch_landed(spark, path, "a", 5, born)
    assert not batch_landed(spark, path, "c", 0, born)


def test_the_look_back_ends_at_the_streams_newest_commit(spark, tmp_path):
    path = str(tmp_path / "t")
    born = int(time.time() * 1000)
    append_labelled(spark, path, "a", 7)
    append_labelled(spark, path, "a", 8)
    # Batches commit in order: whatever lies behind batch 8's commit is older.
    assert batch_landed(spark, path, "a", 7, born)
    append_labelled(spark, path, "a", 3)
    # The stream's newest commit ends the look-back, whatever lies behind it.
    assert not batch_landed(spark, path, "a", 7, born)


def test_a_batch_landed_with_a_delta_transaction_id_counts_as_landed(spark, tmp_path):
    path = str(tmp_path / "t")
    born = int(time.time() * 1000)
    rows = spark.createDataFrame([("a", 2)], "app string, batch long")
    rows.write.format("delta").mode("append").option("txnAppId", "a").option("txnVersion", 2).save(path)
    assert batch_landed(spark, path, "a", 2, born)
    assert not batch_landed(spark, path, "a", 3, born)


def test_the_look_back_stops_at_commits_older_than_the_stream(spark, tmp_path):
    path = str(tmp_path / "t")
    append_labelled(spark, path, "a", 1)
    append_plain(spark, path)
    born_much_later = int(time.time() * 1000) + 2 * CLOCK_SKEW_MS
    assert not batch_landed(spark, path, "a", 1, born_much_later)
    assert batch_landed(spark, path, "a", 1, int(time.time() * 1000))
