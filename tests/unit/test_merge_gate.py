"""Which pipelines a scheduled or Asset-triggered late merge folds in
(``tidemark_airflow.merging``); a run someone triggers merges its own (test_dags.py)."""

from datetime import UTC, datetime

from tidemark_airflow.merging import merge_due, pipelines_due

QUARTER_PAST = datetime(2026, 11, 26, 14, 15, tzinfo=UTC)
ON_THE_HOUR = datetime(2026, 11, 26, 15, 0, tzinfo=UTC)


def test_a_scheduled_run_merges_once_enough_late_records_wait():
    assert merge_due(25, 25, "scheduled", QUARTER_PAST)
    assert not merge_due(24, 25, "scheduled", QUARTER_PAST)


def test_an_asset_triggered_run_follows_the_same_threshold():
    assert merge_due(30, 25, "asset_triggered", None)
    assert not merge_due(3, 25, "asset_triggered", None)


def test_the_tick_on_the_hour_merges_a_trickle():
    assert merge_due(1, 25, "scheduled", ON_THE_HOUR)


def test_with_nothing_waiting_no_scheduled_run_merges():
    assert not merge_due(0, 25, "scheduled", ON_THE_HOUR)
    assert not merge_due(0, 0, "scheduled", QUARTER_PAST)


def test_every_pipeline_due_is_merged_not_only_the_default_one():
    pending = {"telemetry": 3, "clickstream": 40, "orders": 25}
    assert pipelines_due(pending, 25, "asset_triggered", None) == ["clickstream", "orders"]
    assert pipelines_due(pending, 25, "scheduled", ON_THE_HOUR) == ["telemetry", "clickstream", "orders"]
    assert pipelines_due({"telemetry": 0}, 25, "scheduled", ON_THE_HOUR) == []
