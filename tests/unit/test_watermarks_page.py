"""The Watermarks page's pieces without Airflow: stream states, charts, and the
rendered HTML (escaping, self-refresh, the merge form, empty pipelines in one line)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tidemark_airflow import charts
from tidemark_airflow.health import Liveness
from tidemark_airflow.lakehouse import MIN_WATERMARK
from tidemark_airflow.ui import (
    PipelineView,
    format_duration,
    format_lag,
    format_time,
    merge_notice,
    render_page,
    stream_state,
)

from spark_jobs.config import load_pipeline

PIPELINE = Path(__file__).resolve().parents[2] / "spark_jobs" / "pipelines" / "telemetry.yaml"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
NOW = T0.timestamp() + 3_600
RUNNING = {"status": "running", "started_at": T0}


def step(batch: int, watermark: int, clocks: dict[str, int] | None, on_time: int = 9, late: int = 1) -> dict:
    return {
        "batch_id": batch,
        "watermark": watermark,
        "processing_time": T0 + timedelta(seconds=10 * batch),
        "active_partitions": 2,
        "idle_partitions": 0,
        "on_time_count": on_time,
        "late_count": late,
        "partition_clocks": None
        if clocks is None
        else [{"source_partition": p, "partition_watermark": w} for p, w in clocks.items()],
    }


def status(**overrides) -> dict:
    empty = {
        "kafka": None,
        "watermark": None,
        "partitions": [],
        "backlog": {},
        "merges": [],
        "history": [],
        "rejects": {},
        "streams": {"bronze": {"run": None, "live": Liveness()}},
        "tuning": [],
    }
    return {**empty, **overrides}


def tuned(candidate: str, late_share: float, delay_ms: float | None) -> dict:
    """A row of the newest ``tidemark tune --save`` run, as ``lakehouse.latest_tuning`` reads it."""
    return {
        "run_id": "r1",
        "tuned_at": T0,
        "history": "bronze",
        "candidate": candidate,
        "late_share": late_share,
        "late_pairs": round(late_share * 1_000),
        "delay_event_p50_ms": delay_ms,
    }


def test_a_running_stream_with_a_recent_batch_is_live():
    assert stream_state(RUNNING, Liveness(last_commit=4, committed_at=NOW - 30), NOW) == "live"


def test_a_running_stream_without_a_batch_for_long_is_quiet():
    assert stream_state(RUNNING, Liveness(last_commit=4, committed_at=NOW - 3_000), NOW) == "quiet"


def test_a_batch_at_work_past_the_watchdogs_limit_is_stalled():
    live = Liveness(last_commit=4, committed_at=NOW - 2_000, running_batch=5, running_since=NOW - 1_000)
    assert stream_state(RUNNING, live, NOW) == "stalled"


def test_a_finished_or_failed_run_is_stopped_or_failed():
    live = Liveness(last_commit=4, committed_at=NOW - 30)
    assert stream_state({"status": "succeeded"}, live, NOW) == "stopped"
    assert stream_state({"status": "failed"}, live, NOW) == "failed"
    assert stream_state(None, Liveness(), NOW) == "not-started"


def test_the_lag_chart_draws_a_line_per_partition_with_the_one_behind_lower():
    history = [step(1, 10_000, {"0": 10_000, "1": 12_000}), step(2, 20_000, {"0": 20_000, "1": 15_000})]
    chart = charts.lag_chart(history, format_time, format_lag)
    assert [series.name for series in chart.series] == ["0", "1"]
    one = chart.series[1].marks
    # Partition 1 is 2 s ahead, then 5 s behind: further down the chart (larger y).
    assert one[1].y > one[0].y
    assert one[1].tip.endswith("5 s behind") and one[0].tip.endswith("2 s ahead")


def test_the_lag_chart_skips_steps_without_clocks_and_infinite_watermarks():
    history = [step(1, 10_000, None), step(2, 20_000, {"0": 20_000, "1": MIN_WATERMARK})]
    assert charts.lag_chart(history, format_time, format_lag) is None


def test_the_late_share_chart_has_a_bar_per_batch_with_records_taller_when_more_is_late():
    history = [step(1, 10_000, None, 9, 1), step(2, 20_000, None, 0, 0), step(3, 30_000, None, 5, 5)]
    chart = charts.late_share_chart(history, format_time)
    assert len(chart.bars) == 2
    assert chart.bars[1].height > chart.bars[0].height > 0
    assert "5 of 10 records late (50.0%)" in chart.bars[1].tip
    # The tallest bar reaches the top of the plot, where the axis reads its share.
    assert chart.bars[1].y == charts.TOP and chart.labels[0].text == "50.0%"


def test_the_tradeoff_chart_puts_each_tuned_candidate_by_its_delay_and_late_share():
    rows = [tuned("2s", 0.05, 3_000.0), tuned("30s", 0.001, 31_000.0), tuned("never fired", 0.0, None)]
    chart = charts.tradeoff_chart(rows, format_duration)
    tight, loose = chart.series[0].marks
    assert loose.x > tight.x and loose.y > tight.y  # later, and lower (fewer late; y grows down)
    assert [label.text for label in chart.labels[:2]] == ["2s", "30s"]
    assert tight.tip == "2s: 5.00 % of pairs late; fires 3 s after a window's end"
    assert charts.tradeoff_chart([], format_duration) is None
    assert charts.tradeoff_chart([tuned("never fired", 0.0, None)], format_duration) is None


def test_a_session_pipelines_tradeoff_chart_speaks_of_records_and_sessions():
    chart = charts.tradeoff_chart([tuned("2s", 0.05, 3_000.0)], format_duration, sessions=True)
    assert chart.series[0].marks[0].tip == "2s: 5.00 % of records late; fires 3 s after a session's end"
    assert chart.title.startswith("Late records against firing delay")


def test_a_tuned_pipeline_shows_the_tradeoff_chart_with_escaped_candidates():
    config = load_pipeline(PIPELINE)
    history = [step(1, 10_000, {"0": 10_000})]
    rows = [tuned("<b>2s</b>", 0.05, 3_000.0)]
    page = render_page(
        "/lh",
        [
            PipelineView(
                "telemetry",
                str(PIPELINE),
                config,
                status=status(watermark=10_000, history=history, tuning=rows),
            )
        ],
        T0,
    )
    assert "Late pairs against firing delay (tidemark tune over bronze, 2026-03-01 12:00 UTC)" in page
    assert "&lt;b&gt;2s&lt;/b&gt;" in page and "<b>2s</b>" not in page


def test_the_settings_name_a_custom_generator():
    config = load_pipeline(PIPELINE.parents[2] / "docs" / "examples" / "telemetry-adaptive.yaml")
    view = PipelineView(
        "telemetry_adaptive", "x.yaml", config, status=status(watermark=1, history=[step(1, 1, None)])
    )
    assert "watermark custom \u00b7 generator spark_jobs.eventtime.adaptive:AdaptiveBound" in render_page(
        "/lh", [view], T0
    )


def test_the_page_refreshes_itself_unless_held():
    config = load_pipeline(PIPELINE)
    view = PipelineView("telemetry", str(PIPELINE), config, status=status())
    assert '<meta http-equiv="refresh" content="10">' in render_page("/lh", [view], T0, refresh=10)
    assert "http-equiv" not in render_page("/lh", [view], T0, refresh=0)


def test_a_pipeline_without_data_is_one_line_and_one_with_data_a_section():
    config = load_pipeline(PIPELINE)
    empty = PipelineView("telemetry", str(PIPELINE), config, status=status())
    page = render_page("/lh", [empty], T0)
    assert '<li data-pipeline="telemetry">' in page and 'id="pipeline-telemetry"' not in page
    merges = [
        {
            "status": "succeeded",
            "started_at": T0,
            "duration_ms": 1,
            "rows_in": 1,
            "rows_out": 1,
            "message": "",
        }
    ]
    ran = PipelineView("telemetry", str(PIPELINE), config, status=status(merges=merges))
    page = render_page("/lh", [ran], T0)
    assert 'id="pipeline-telemetry"' in page and '<li data-pipeline="telemetry">' not in page
    assert '<form class="merge" method="post" action="pipelines/telemetry/merge">' in page


def test_everything_read_from_files_and_tables_is_escaped():
    config = load_pipeline(PIPELINE)
    hostile = "<script>alert(1)</script>"
    merges = [
        {
            "status": "failed",
            "started_at": T0,
            "duration_ms": 1,
            "rows_in": 0,
            "rows_out": 0,
            "message": hostile,
        }
    ]
    views = [
        PipelineView("telemetry", hostile, config, status=status(merges=merges, rejects={hostile: 3})),
        PipelineView("broken", "/x.yaml", error=hostile),
    ]
    page = render_page(hostile, views, T0, notice={"kind": "error", "text": hostile})
    assert page.count("<script>") == 1  # the page's own; none from the data
    # The lakehouse, the notice, the file, the load error, the merge message, the reason (twice).
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;") == 7


def test_the_summary_names_the_last_window_the_watermark_fired():
    config = load_pipeline(PIPELINE)  # tumbling one-minute windows
    watermark = int(T0.timestamp() * 1000) + 59_999  # 12:00:59.999 fires [12:00, 12:01)
    view = PipelineView(
        "telemetry", str(PIPELINE), config, status=status(watermark=watermark, history=[step(1, 1, None)])
    )
    page = render_page("/lh", [view], T0)
    assert '<dd class="fired">[2026-03-01 12:00:00.000, 2026-03-01 12:01:00.000)</dd>' in page


def partition_flags(page: str) -> dict[str, list[str]]:
    rows = re.findall(r'<tr data-partition="([^"]+)">(.*?)</tr>', page, re.S)
    return {partition: re.findall(r'<span class="flag ([a-z-]+)">', cells) for partition, cells in rows}


def test_an_idle_partition_is_flagged_idle_only_and_an_active_one_behind_catching_up():
    # The engine marks every idle partition unaligned (it must catch up when it is back);
    # "catching-up" is for an active partition that has not rejoined the minimum yet.
    def clock(partition: str, idle: bool, aligned: bool) -> dict:
        return {
            "source_partition": partition,
            "partition_watermark": 1_000,
            "max_event_time": T0,
            "is_idle": idle,
            "is_aligned": aligned,
            "last_data_at": T0,
            "updated_at": T0,
            "lag_ms": 0,
        }

    clocks = [clock("0", False, True), clock("1", True, False), clock("2", False, False)]
    view = PipelineView("telemetry", "/t.yaml", load_pipeline(PIPELINE), status=status(partitions=clocks))
    page = render_page("/lh", [view], T0)
    assert partition_flags(page) == {"0": [], "1": ["idle"], "2": ["catching-up"]}


def test_a_refused_merge_says_which_pipeline_and_airflows_reason():
    notice = merge_notice(None, None, "telemetry", "HTTP 500: database is locked")
    assert notice == {
        "kind": "error",
        "text": "Airflow refused the late merge for telemetry: HTTP 500: database is locked.",
    }
