"""What a source reports with each bronze batch: partitions, offsets, lag, and
how silver turns the reports into declared partitions and backlog."""

import json
from datetime import UTC, datetime, timedelta

from spark_jobs.engine.clocks import plan_clocks
from spark_jobs.engine.judging import Summary
from spark_jobs.eventtime import MIN_WATERMARK, WatermarkSpec
from spark_jobs.eventtime.tracker import PartitionInput, WatermarkTracker
from spark_jobs.sources.progress import (
    PartitionOffsets,
    SourceProgress,
    kafka_batch_offsets,
    kafka_lag,
    known_partitions,
    lag_stall,
    lagging_partitions,
)

OFFSET_LOG = """v1
{"batchWatermarkMs":0,"batchTimestampMs":1795534565713,"conf":{"spark.sql.shuffle.partitions":"2"}}
{"clicks":{"2":0,"1":40,"0":38}}
"""


def test_the_batch_end_offsets_come_from_the_checkpoint_offset_log():
    assert kafka_batch_offsets(OFFSET_LOG, "clicks") == {"0": 38, "1": 40, "2": 0}


def test_an_offset_log_without_the_topic_is_an_error_not_an_empty_report():
    try:
        kafka_batch_offsets(OFFSET_LOG, "orders")
    except ValueError as error:
        assert "orders" in str(error)
    else:
        raise AssertionError("expected a ValueError")


def test_lag_is_the_latest_offset_beyond_the_end_offset():
    report = SourceProgress.of_offsets({"0": 38, "1": 40, "2": 0}, {"0": 38, "1": 45, "2": 0})
    assert report.partitions["1"].lag == 5
    assert report.lagging == {"1"}


def test_a_partition_added_to_the_topic_after_the_batch_plan_is_known_and_lags_from_offset_zero():
    report = SourceProgress.of_offsets({"0": 10}, {"0": 10, "1": 3})
    assert report.partitions["1"] == PartitionOffsets(0, 3)
    assert report.lagging == {"1"}


def test_declared_partitions_have_no_offsets_and_never_lag():
    report = SourceProgress.declared(["0", "1"])
    assert set(report.partitions) == {"0", "1"}
    assert report.lagging == set()


def test_a_report_survives_the_commit_metadata_round_trip():
    report = SourceProgress.of_offsets({"0": 1, "10": 2}, {"0": 4, "10": 2})
    assert SourceProgress.from_metadata(json.dumps(report.as_metadata())) == report


def test_commit_metadata_that_is_not_a_report_reads_as_none():
    for text in (None, "", "not json", '{"other": 1}', '{"source_partitions": [1, 2]}'):
        assert SourceProgress.from_metadata(text) is None


def test_kafka_lag_now_compares_the_topic_with_bronzes_last_report():
    consumed = SourceProgress.of_offsets({"0": 10, "1": 20}, {"0": 10, "1": 20})
    assert kafka_lag(consumed, {"0": 10, "1": 26, "2": 4}) == {"1": 6, "2": 4}


def test_lag_is_a_stall_once_the_first_unread_record_is_older_than_the_stall_limit():
    now = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
    minute_ago = int((now - timedelta(minutes=1)).timestamp() * 1000)
    assert lag_stall({"3": 9}, {"3": minute_ago}, now, 61_000) is None
    assert "9 records on partitions 3" in lag_stall({"3": 9}, {"3": minute_ago}, now, 60_000)


def test_a_young_lag_after_a_long_quiet_topic_is_no_stall():
    # Bronze last committed hours ago (nothing to read); one record arrived a second ago.
    now = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
    second_ago = int(now.timestamp() * 1000) - 1_000
    assert lag_stall({"0": 1}, {"0": second_ago}, now, 60_000) is None


def test_a_partition_whose_latest_offset_is_unknown_is_not_known_to_be_caught_up():
    report = SourceProgress.of_offsets({"0": 5, "1": 7}, {"0": 5})
    assert report.lagging == {"1"}
    assert SourceProgress.declared(["0"]).lagging == set()


def test_known_and_lagging_partitions_are_unions_over_reports():
    reports = [SourceProgress.of_offsets({"0": 1}, {"0": 2}), SourceProgress.declared(["5"])]
    assert known_partitions(reports) == {"0", "5"}
    assert lagging_partitions(reports) == {"0"}


def tracker(idleness_ms: int | None = None) -> WatermarkTracker:
    return WatermarkTracker(WatermarkSpec("bounded", 0, idleness_ms))


def test_silver_declares_every_reported_partition_so_a_silent_one_holds_the_watermark():
    summary = [Summary(1, "0", PartitionInput(50_000), 1_000, 3)]
    reports = {1: SourceProgress.declared(["0", "1"])}
    plan = plan_clocks(tracker(), summary, set(), reports)
    assert plan[0].watermark_after == MIN_WATERMARK
    assert plan_clocks(tracker(), summary, set(), {})[0].watermark_after == 49_999


def test_a_partition_that_lags_at_the_source_is_never_idle():
    summary = [
        Summary(1, "0", PartitionInput(50_000), 1_000, 3),
        Summary(2, "0", PartitionInput(60_000), 9_000, 3),
    ]
    lagging = {2: SourceProgress.of_offsets({"0": 6, "1": 0}, {"0": 6, "1": 100})}
    plan = plan_clocks(
        tracker(idleness_ms=1_000), summary, set(), {1: SourceProgress.declared(["0", "1"]), **lagging}
    )
    assert [clock.idle_partitions for clock in plan] == [0, 0]
    assert plan[-1].watermark_after == MIN_WATERMARK


def test_without_lag_a_silent_declared_partition_goes_idle_after_the_timeout():
    summary = [
        Summary(1, "0", PartitionInput(50_000), 1_000, 3),
        Summary(2, "0", PartitionInput(60_000), 9_000, 3),
    ]
    plan = plan_clocks(tracker(idleness_ms=1_000), summary, set(), {1: SourceProgress.declared(["0", "1"])})
    assert [clock.idle_partitions for clock in plan] == [0, 1]
    assert plan[-1].watermark_after == 59_999
