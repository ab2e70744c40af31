"""``tidemark tune`` without Spark: reading candidates, the driver-side lookups, the
outputs, and bad input refused before Spark starts."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from spark_jobs.config import ConfigError, load_pipeline
from spark_jobs.engine.judging import Summary
from spark_jobs.engine.tuning import Outcome, first_at_least, parse_candidate, running_newest
from spark_jobs.engine.tuning_report import as_json, chart_svg, table
from spark_jobs.eventtime.clock import MIN_WATERMARK
from spark_jobs.eventtime.generators import PartitionInput, WatermarkSpec
from spark_jobs.eventtime.windows import SessionSpec
from spark_jobs.jobs import tune

PIPELINES = Path(__file__).resolve().parents[2] / "spark_jobs" / "pipelines"
TELEMETRY, RIDES = PIPELINES / "telemetry.yaml", PIPELINES / "rides.yaml"


@pytest.fixture(scope="module")
def config():
    return load_pipeline(TELEMETRY)


def test_a_duration_is_a_bound_with_the_pipelines_lateness_and_idleness(config):
    candidate = parse_candidate("2s", config)
    assert (candidate.watermark.strategy, candidate.watermark.max_out_of_orderness_ms) == ("bounded", 2_000)
    assert candidate.allowed_lateness_ms == config.allowed_lateness_ms == 30_000
    assert candidate.watermark.idleness_ms == config.watermark.idleness_ms == 60_000


def test_a_plus_sets_the_allowed_lateness(config):
    assert parse_candidate("5s+2m", config).allowed_lateness_ms == 120_000
    assert parse_candidate("pipeline+0s", config).allowed_lateness_ms == 0


def test_pipeline_is_the_pipelines_own_setting(config):
    assert parse_candidate("pipeline", config).watermark == config.watermark


def test_a_generator_class_takes_options_read_as_yaml(config):
    candidate = parse_candidate(
        "spark_jobs.eventtime.adaptive:AdaptiveBound(floor=2s, quantile=0.9)+1m", config
    )
    assert candidate.watermark.strategy == "custom"
    assert candidate.watermark.options == {"floor": "2s", "quantile": 0.9}
    assert candidate.allowed_lateness_ms == 60_000
    assert candidate.watermark.new_generator().quantile == 0.9


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("soon", "expected a bound (5s)"),
        ("5s(floor=1s)", "expected a bound (5s)"),
        ("-5s", "must not be negative"),
        ("5s+later", "allowed lateness: expected a duration"),
        ("no_such_module_here:Gen", "cannot import"),
        ("spark_jobs.eventtime.adaptive:AdaptiveBound(floor)", "expected options as name=value"),
        ("spark_jobs.eventtime.adaptive:AdaptiveBound(quantile=0.7)", "quantile must be one of"),
        ("spark_jobs.eventtime.adaptive:AdaptiveBound(floor=[)", "cannot read the value of 'floor'"),
    ],
)
def test_a_candidate_that_cannot_be_read_is_an_error_naming_it(config, text, problem):
    with pytest.raises(ConfigError) as error:
        parse_candidate(text, config)
    assert repr(text) in str(error.value) and problem in str(error.value)


def test_first_at_least_finds_the_first_index_reaching_a_threshold():
    assert first_at_least([1, 3, 3, 7], 3) == 1
    assert first_at_least([1, 3, 3, 7], 4) == 3
    assert first_at_least([1, 3], 4) is None


def test_the_newest_event_time_runs_over_versions_and_partitions():
    summary = [
        Summary(4, "0", PartitionInput(None, 5), 0, 1),  # a marker only
        Summary(5, "0", PartitionInput(100), 0, 1),
        Summary(5, "1", PartitionInput(300), 0, 1),
        Summary(6, "1", PartitionInput(200), 0, 1),
    ]
    assert running_newest(summary, [4, 5, 6]) == [MIN_WATERMARK, 300, 300]


OUTCOMES = [
    Outcome("2s", 200, 20, {"0": 15, "2": 5}, 50, 48, 6, 2, (2_500.0, 4_000.0), (1.0, 2.0)),
    Outcome("30s <b>", 200, 2, {"0": 2}, 50, 45, 1, 5, (31_000.0, 33_500.0), (5.0, 6.0)),
    Outcome("never", 200, 0, {}, 50, 0, 0, 50, None, None),
]


def test_the_table_has_a_row_per_candidate_with_its_figures():
    lines = table(OUTCOMES).splitlines()
    assert lines[0].split()[:3] == ["candidate", "late", "pairs"]
    assert lines[1].split() == ["2s", "20", "10.00", "50", "48", "12.5", "2", "2.5s", "4.0s", "1", "2"]
    assert lines[3].split()[-4:] == ["-", "-", "-", "-"]


def test_a_session_pipelines_table_names_records_and_sessions_and_adds_split_and_merged():
    sessions = [replace(OUTCOMES[0], split=3, merged=4)]
    header, row = table(sessions, sessions=True).splitlines()
    assert header.split()[:7] == ["candidate", "late", "records", "late", "%", "sessions", "split"]
    assert row.split()[:6] == ["2s", "20", "10.00", "50", "3", "4"]
    first = json.loads(as_json(sessions))[0]
    assert (first["split"], first["merged"]) == (3, 4)


def test_json_carries_every_figure():
    first = json.loads(as_json(OUTCOMES))[0]
    assert first["late_pairs_by_partition"] == {"0": 15, "2": 5}
    assert first["late_share"] == 0.1 and first["refire_share"] == 6 / 48
    assert (first["delay_event_p50_ms"], first["delay_event_p95_ms"]) == (2_500.0, 4_000.0)
    assert (first["delay_batches_p50"], first["delay_batches_p95"]) == (1.0, 2.0)


def test_the_chart_plots_each_candidate_that_fired_with_escaped_labels():
    svg = chart_svg(OUTCOMES, "t & t")
    assert svg.count("<circle") == 2
    assert "30s &lt;b&gt;" in svg and "<b>" not in svg and "t &amp; t" in svg
    # The looser candidate sits further right (later) and lower (fewer late).
    (x_tight, y_tight), (x_loose, y_loose) = [
        tuple(float(part.split('"')[1]) for part in line.split()[1:3])
        for line in svg.splitlines()
        if line.startswith("<circle")
    ]
    assert x_loose > x_tight and y_loose > y_tight  # SVG's y grows downwards


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--bronze", "--candidates", "soon"], "'soon': expected a bound"),
        (["--bronze", "--batch-size", "5", "--candidates", "5s"], "--batch-size: cuts an --input file"),
        (["--bronze", "--batch-column", "b", "--candidates", "5s"], "--batch-column: cuts an --input file"),
        (["--input", "/no/such/file.json", "--candidates", "5s"], "--input: cannot read /no/such/file.json"),
    ],
)
def test_bad_input_is_refused_before_spark_starts(arguments, message, capsys):
    assert tune.main(["--pipeline", str(TELEMETRY), *arguments]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("pipeline", "gaps", "message"),
    [
        (TELEMETRY, ["5m"], "--gaps: tries session gaps; this pipeline's windows are not sessions"),
        (RIDES, ["5m", "0s"], "--gaps '0s': must be positive"),
        (RIDES, ["soon"], "--gaps 'soon': expected a duration"),
    ],
)
def test_gaps_are_refused_unless_positive_durations_for_a_session_pipeline(pipeline, gaps, message, capsys):
    assert tune.main(["--pipeline", str(pipeline), "--bronze", "--candidates", "5s", "--gaps", *gaps]) == 2
    assert message in capsys.readouterr().err


def test_every_candidate_is_tried_with_every_gap():
    rides = load_pipeline(RIDES)
    candidates = [parse_candidate(text, rides) for text in ("5s", "5s+2m")]
    tried = tune.with_gaps(candidates, ["2m", "10m"], rides)
    assert [(c.label, c.gap_ms, c.allowed_lateness_ms) for c in tried] == [
        ("5s gap 2m", 120_000, rides.allowed_lateness_ms),
        ("5s gap 10m", 600_000, rides.allowed_lateness_ms),
        ("5s+2m gap 2m", 120_000, 120_000),
        ("5s+2m gap 10m", 600_000, 120_000),
    ]
    assert tune.with_gaps(candidates, None, rides) == candidates


def test_gaps_are_refused_where_each_record_carries_its_own():
    rides = load_pipeline(RIDES)
    dynamic = replace(rides, window=SessionSpec.dynamic("battery", 60_000))
    with pytest.raises(ConfigError, match="come from its records"):
        tune.with_gaps([parse_candidate("5s", dynamic)], ["2m"], dynamic)


def test_a_bound_is_refused_for_a_pipeline_with_punctuation_markers(config):
    punctuated = replace(config, watermark=WatermarkSpec("punctuated", marker_column="region"))
    with pytest.raises(ConfigError, match="carry punctuation markers"):
        parse_candidate("5s", punctuated)
    assert parse_candidate("pipeline", punctuated).watermark == punctuated.watermark
