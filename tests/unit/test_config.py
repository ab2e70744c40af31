import copy
from pathlib import Path

import pytest
import yaml

from spark_jobs.config import ConfigError, load_pipeline, parse_duration, parse_pipeline

PIPELINES = Path(__file__).resolve().parents[2] / "spark_jobs" / "pipelines"


def telemetry() -> dict:
    return yaml.safe_load((PIPELINES / "telemetry.yaml").read_text())


@pytest.mark.parametrize("path", sorted(PIPELINES.glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_pipelines_are_valid(path):
    assert load_pipeline(path).name == path.stem


def test_demo_pipeline_loads_into_typed_fields():
    config = parse_pipeline(telemetry())
    assert config.watermark.max_out_of_orderness_ms == 5_000
    assert config.watermark.idleness_ms == 60_000
    assert (config.window.size_ms, config.window.slide_ms) == (60_000, 60_000)
    assert config.allowed_lateness_ms == 30_000
    assert config.measure_columns == ["battery_avg", "battery_min", "speed_max"]
    assert config.gold.grain_ms == 3_600_000 and config.gold.group_by == ("region",)
    assert config.offline.timeout_ms == 1_800_000 and config.offline.key == ("device_id",)


@pytest.mark.parametrize(
    ("text", "millis"),
    [("500ms", 500), ("5s", 5_000), ("30m", 1_800_000), ("1h", 3_600_000), ("2d", 172_800_000), ("0s", 0)],
)
def test_durations_take_a_unit(text, millis):
    assert parse_duration(text, "f") == millis


@pytest.mark.parametrize("text", ["5", "5 sec", "", "1.5s", "-5s", 5])
def test_durations_without_a_valid_unit_or_negative_are_refused(text):
    with pytest.raises(ConfigError) as error:
        parse_duration(text, "window.size")
    assert error.value.field == "window.size"


def mutate(path: str, value):
    """Set (or, with value DELETE, remove) a dotted path in the demo config."""
    document = copy.deepcopy(telemetry())
    *parents, last = path.split(".")
    section = document
    for part in parents:
        section = section[part]
    if value is DELETE:
        del section[last]
    else:
        section[last] = value
    return document


DELETE = object()

BAD_CONFIGS = [
    ("pipeline", "Telemetry", "pipeline", "[a-z]"),
    ("pipeline", DELETE, "pipeline", "required"),
    ("colour", "blue", "colour", "unknown field"),
    ("source.kind", "ftp", "source.kind", "unknown value 'ftp'"),
    ("source.path", DELETE, "source.path", "required"),
    ("source.format", "xml", "source.format", "unknown value"),
    ("source.max_files_per_trigger", 0, "source.max_files_per_trigger", "positive integer"),
    ("schema.battery", "complex", "schema.battery", "unknown value"),
    ("event_time.column", "when", "event_time.column", "not a column"),
    ("event_time.format", "nonsense", "event_time.format", "unknown format"),
    ("event_time.format", "iso8601", "event_time.column", "parses text"),
    ("event_time.timezone", "Mars/Olympus", "event_time.timezone", "unknown time zone"),
    ("event_time.max_future_skew", "0s", "event_time.max_future_skew", "positive"),
    ("time_characteristic", "wallclock", "time_characteristic", "unknown value"),
    ("partition_column", DELETE, "partition_column", "required for a files source"),
    ("partition_column", "shard", "partition_column", "not a column"),
    ("key", [], "key", "non-empty"),
    ("key", DELETE, "key", "required"),
    ("key", ["region", "nope"], "key[1]", "not a column"),
    ("watermark.strategy", "eager", "watermark.strategy", "unknown value 'eager'"),
    ("watermark.max_out_of_orderness", "-5s", "watermark.max_out_of_orderness", "negative"),
    ("watermark.max_out_of_orderness", DELETE, "watermark.max_out_of_orderness", "required"),
    ("watermark.idleness", "0s", "watermark.idleness", "positive"),
    ("window.type", "session", "window.type", "unknown value"),
    ("window.size", "-1m", "window.size", "negative"),
    ("window.slide", "30s", "window.slide", "only applies to sliding"),
    ("window.offset", "1m", "window.offset", "smaller than"),
    ("allowed_lateness", "-30s", "allowed_lateness", "negative"),
    ("measures.battery", ["median"], "measures.battery", "not mergeable"),
    ("measures.battery", ["avg", "avg"], "measures.battery", "twice"),
    ("measures.region", ["avg"], "measures.region", "numeric"),
    ("measures.altitude", ["max"], "measures.altitude", "not a column"),
    ("gold.grain", "90s", "gold.grain", "multiple of window.size"),
    ("gold.group_by", ["battery"], "gold.group_by[0]", "not a key column"),
    ("gold.name", "Hourly!", "gold.name", "[a-z]"),
    ("offline.timeout", "0m", "offline.timeout", "positive"),
    ("offline.key", ["imei"], "offline.key[0]", "not a column"),
]


@pytest.mark.parametrize(
    ("path", "value", "field", "message"), BAD_CONFIGS, ids=[c[0] + "=" + repr(c[1]) for c in BAD_CONFIGS]
)
def test_bad_config_names_the_field_and_the_problem(path, value, field, message):
    with pytest.raises(ConfigError) as error:
        parse_pipeline(mutate(path, value))
    assert error.value.field == field
    assert message in str(error.value)


def test_punctuated_strategy_needs_a_marker_column_from_the_schema():
    document = mutate("watermark", {"strategy": "punctuated"})
    with pytest.raises(ConfigError, match=r"watermark\.marker_column: is required"):
        parse_pipeline(document)
    document["watermark"]["marker_column"] = "nope"
    with pytest.raises(ConfigError, match=r"watermark\.marker_column"):
        parse_pipeline(document)


def test_sliding_windows_refuse_a_gold_rollup_that_would_count_records_twice():
    document = mutate("window", {"type": "sliding", "size": "10m", "slide": "1m"})
    with pytest.raises(ConfigError) as error:
        parse_pipeline(document)
    assert error.value.field == "gold"


def test_kafka_source_needs_a_topic():
    document = mutate("source", {"kind": "kafka", "bootstrap_servers": "127.0.0.1:9092"})
    with pytest.raises(ConfigError, match=r"source\.topic: is required"):
        parse_pipeline(document)


def test_load_pipeline_names_the_file_in_the_error(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("pipeline: [unclosed\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml: <file>: not valid YAML"):
        load_pipeline(path)


def test_a_document_that_is_not_a_mapping_is_refused():
    with pytest.raises(ConfigError, match="<root>: expected a mapping"):
        parse_pipeline(["pipeline", "x"])
