import copy
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.config import RESERVED_COLUMNS, ConfigError, load_pipeline, parse_duration, parse_pipeline
from spark_jobs.eventtime.windows import SessionSpec

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


class Deleted:
    """The field removed from the document (a stable test id, so parallel workers agree)."""

    def __repr__(self) -> str:
        return "<deleted>"


DELETE = Deleted()

BAD_CONFIGS = [
    ("pipeline", "Telemetry", "pipeline", "[a-z]"),
    ("pipeline", DELETE, "pipeline", "required"),
    ("colour", "blue", "colour", "unknown field"),
    ("source.kind", "ftp", "source.kind", "unknown value 'ftp'"),
    ("source.path", DELETE, "source.path", "required"),
    ("source.format", "xml", "source.format", "unknown value"),
    ("source.max_files_per_trigger", 0, "source.max_files_per_trigger", "positive integer"),
    ("source.partitions", 0, "source.partitions", "positive integer"),
    ("source.partitions", [], "source.partitions", "non-empty list"),
    ("source.partitions", [0, "0"], "source.partitions", "twice"),
    ("source.partitions", [0, 1.5], "source.partitions", "strings or integers"),
    ("source.partitions", ["eu"], "source.partitions", "int partition column"),
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
    ("window.type", "hopping", "window.type", "unknown value"),
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
    # Each of these passed validation and failed later, inside Spark:
    ("pipeline", "t" * 65, "pipeline", "at most 64"),  # a table folder name too long
    ("schema.status", "string", "schema.status", "Tidemark uses itself"),  # a duplicate quarantine column
    ("schema.Battery", "double", "schema.Battery", "ignores case"),
    ("event_time.timezone", "localtime", "event_time.timezone", "unknown time zone"),  # Java has none
    ("event_time.timezone", "posix/Europe/Paris", "event_time.timezone", "unknown time zone"),
    ("event_time.timezone", "America", "event_time.timezone", "unknown time zone"),  # was IsADirectoryError
    ("window.size", "999999999999d", "window.size", "timestamp range"),  # beyond a long
    ("gold.group_by", ["region", "region"], "gold.group_by", "twice"),
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


def test_a_session_window_takes_a_fixed_gap():
    document = mutate("window", {"type": "session", "gap": "5m"})
    del document["gold"]
    assert parse_pipeline(document).window == SessionSpec.fixed(300_000)


def test_a_session_window_takes_a_gap_column_bounded_by_max_gap():
    document = mutate("window", {"type": "session", "gap_column": "ts", "max_gap": "1h"})
    del document["gold"]
    assert parse_pipeline(document).window == SessionSpec.dynamic("ts", 3_600_000)


def test_a_session_window_takes_a_max_duration_with_either_gap():
    fixed = mutate("window", {"type": "session", "gap": "5m", "max_duration": "1h"})
    dynamic = mutate("window", {"type": "session", "gap_column": "ts", "max_gap": "1h", "max_duration": "2h"})
    for document in (fixed, dynamic):
        del document["gold"]
    assert parse_pipeline(fixed).window == SessionSpec(gap_ms=300_000, max_duration_ms=3_600_000)
    assert parse_pipeline(dynamic).window == SessionSpec(
        gap_column="ts", max_gap_ms=3_600_000, max_duration_ms=7_200_000
    )


BAD_SESSION_WINDOWS = [
    ({"gap": "5m", "size": "1m"}, "window.size", "unknown field"),
    ({}, "window.gap", "either gap or gap_column"),
    ({"gap": "5m", "gap_column": "ts", "max_gap": "1h"}, "window.gap", "either gap or gap_column"),
    ({"gap": "0s"}, "window.gap", "positive"),
    ({"gap": "5m", "max_gap": "1h"}, "window.max_gap", "only applies with a gap_column"),
    ({"gap_column": "ts"}, "window.max_gap", "required"),
    ({"gap_column": "ts", "max_gap": "0m"}, "window.max_gap", "positive"),
    ({"gap_column": "nope", "max_gap": "1h"}, "window.gap_column", "not a column"),
    ({"gap_column": "battery", "max_gap": "1h"}, "window.gap_column", "int or long"),
    ({"gap": "5m", "max_duration": "0s"}, "window.max_duration", "positive"),
    ({"gap": "5m", "max_duration": "soon"}, "window.max_duration", "expected a duration"),
]


@pytest.mark.parametrize(
    ("section", "field", "message"), BAD_SESSION_WINDOWS, ids=[f for _, f, _ in BAD_SESSION_WINDOWS]
)
def test_a_bad_session_window_names_the_field_and_the_problem(section, field, message):
    document = mutate("window", {"type": "session", **section})
    del document["gold"]
    with pytest.raises(ConfigError) as error:
        parse_pipeline(document)
    assert error.value.field == field
    assert message in str(error.value)


def test_a_session_pipelines_payload_cannot_have_a_column_its_silver_uses():
    document = mutate("window", {"type": "session", "gap": "5m"})
    del document["gold"]
    document["schema"]["Session_Id"] = "string"
    with pytest.raises(ConfigError) as error:
        parse_pipeline(document)
    assert error.value.field == "schema.Session_Id"


def test_a_session_pipelines_gold_grain_is_any_positive_duration():
    document = mutate("window", {"type": "session", "gap": "5m"})
    document["gold"]["grain"] = "7m"
    assert parse_pipeline(document).gold.grain_ms == 420_000
    document["gold"]["grain"] = "0s"
    with pytest.raises(ConfigError) as error:
        parse_pipeline(document)
    assert error.value.field == "gold.grain"


def test_kafka_source_needs_a_topic():
    document = mutate("source", {"kind": "kafka", "bootstrap_servers": "127.0.0.1:9092"})
    with pytest.raises(ConfigError, match=r"source\.topic: is required"):
        parse_pipeline(document)


def test_declared_file_partitions_are_a_count_or_the_partition_column_values():
    assert parse_pipeline(mutate("source.partitions", 3)).source.partitions == ("0", "1", "2")
    assert parse_pipeline(mutate("source.partitions", [7, 3])).source.partitions == ("7", "3")
    assert parse_pipeline(telemetry()).source.partitions == ()


def test_a_kafka_source_does_not_take_declared_partitions():
    document = telemetry()
    document["source"] = {"kind": "kafka", "bootstrap_servers": "b:9092", "topic": "t", "partitions": 4}
    with pytest.raises(ConfigError) as error:
        parse_pipeline(document)
    assert error.value.field == "source.partitions"


def test_load_pipeline_names_the_file_in_the_error(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("pipeline: [unclosed\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml: <file>: not valid YAML"):
        load_pipeline(path)


def configured(folder: Path, monkeypatch, **files: str) -> None:
    """Pipeline files named by their stems in ``folder``, configured through $TIDEMARK_PIPELINES."""
    for stem, name in files.items():
        (folder / f"{stem}.yaml").write_text(yaml.safe_dump({**telemetry(), "pipeline": name}))
    monkeypatch.setenv("TIDEMARK_PIPELINES", str(folder))


def test_a_configured_pipelines_name_stands_for_its_file(tmp_path, monkeypatch):
    configured(tmp_path, monkeypatch, fleet="fleet")
    config = load_pipeline("fleet")
    assert (config.name, config.source_file) == ("fleet", str(tmp_path / "fleet.yaml"))


def test_a_file_of_that_name_wins_over_a_configured_pipeline(tmp_path, monkeypatch):
    folder = tmp_path / "configured"
    folder.mkdir()
    configured(folder, monkeypatch, fleet="configured_fleet")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fleet").write_text(yaml.safe_dump({**telemetry(), "pipeline": "local_fleet"}))
    assert load_pipeline("fleet").name == "local_fleet"


def test_an_unknown_name_is_refused_with_the_configured_ones(tmp_path, monkeypatch):
    configured(tmp_path, monkeypatch, fleet="fleet", depot="depot")
    unknown = r"--pipeline: no file 'nope' .*\(configured: depot, fleet\)"
    with pytest.raises(ConfigError, match=unknown) as error:
        load_pipeline("nope")
    assert error.value.field == "--pipeline"


def test_a_missing_yaml_path_is_a_missing_file_not_a_name(tmp_path, monkeypatch):
    configured(tmp_path, monkeypatch, fleet="fleet")
    monkeypatch.chdir(tmp_path / "..")
    with pytest.raises(ConfigError, match=r"<file>: cannot read .*fleet\.yaml"):
        load_pipeline("fleet.yaml")


def test_a_document_that_is_not_a_mapping_is_refused():
    with pytest.raises(ConfigError, match="<root>: expected a mapping"):
        parse_pipeline(["pipeline", "x"])


# ---- random damage: whatever a pipeline file holds, loading it raises ConfigError or succeeds
YAML_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=12),
    st.binary(max_size=4),
    st.dates(),
    st.sampled_from(["", "5s", "-1m", "0s", "1.5h", "9" * 30 + "d", "UTC", "America", "../etc/passwd"]),
    st.sampled_from(["region", "device_id", "ts", "battery", "avg", "median", "tumbling", "a`b", "x\n"]),
)
YAML_VALUES = st.recursive(
    YAML_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


def slots(document: dict) -> list[tuple[dict | list, object]]:
    """Every (container, key or index) in a document, the root's included."""
    found: list[tuple[dict | list, object]] = []
    stack: list[dict | list] = [document]
    while stack:
        container = stack.pop()
        keys = list(container) if isinstance(container, dict) else list(range(len(container)))
        for key in keys:
            found.append((container, key))
            if isinstance(container[key], dict | list):
                stack.append(container[key])
    return found


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_random_damage_to_a_valid_config_is_a_config_error_or_still_valid(data):
    document = telemetry()
    for _ in range(data.draw(st.integers(1, 3))):
        container, key = data.draw(st.sampled_from(slots(document)))
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            container[key] = data.draw(YAML_VALUES)
        elif action == "delete":
            del container[key]
        elif isinstance(container, dict):
            container[data.draw(st.text(max_size=8))] = data.draw(YAML_VALUES)
        else:
            container.append(data.draw(YAML_VALUES))
    try:
        parse_pipeline(document)
    except ConfigError as error:
        assert error.field and error.problem, error


@settings(max_examples=150, deadline=None)
@given(
    text=st.one_of(
        st.binary(max_size=200),
        st.text(max_size=200).map(str.encode),
        st.lists(
            st.sampled_from(["pipeline: x\n", "schema:\n", "  a: int\n", "- [\n", "{", ": :", "&a [*a]"])
        )
        .map("".join)
        .map(str.encode),
        st.integers(10, 3_000).map(lambda n: ("[" * n + "]" * n).encode()),
    )
)
def test_any_file_content_loads_as_a_config_error_or_a_pipeline(tmp_path_factory, text):
    path = tmp_path_factory.getbasetemp() / "fuzzed.yaml"
    path.write_bytes(text)
    try:
        load_pipeline(path)
    except ConfigError as error:
        assert "fuzzed.yaml" in str(error)


def test_every_column_the_tables_add_beside_the_payload_is_reserved():
    """A payload column may not take a name the tables use (a duplicate column): the
    reserved list must cover every column the registry adds, in every layer."""
    from spark_jobs.tables import TableRegistry, measure_fields

    config = parse_pipeline(telemetry())
    registry = TableRegistry(config, "/nowhere")
    payload = set(config.schema) | {field.name for field in measure_fields(config, with_state=True)}
    own = [registry.bronze, registry.silver, registry.quarantine, registry.gold, registry.status_events]
    own += [registry.offline_state, registry.late_tracks]
    added = {field.name for table in own for field in table.schema.fields} - payload
    assert added - RESERVED_COLUMNS == set()


def files_source(**fields) -> dict:
    document = telemetry()
    document["source"] = {**document["source"], **fields}
    return document


def test_landed_files_are_kept_unless_the_pipeline_says_otherwise():
    source = parse_pipeline(telemetry()).source
    assert (source.landed_files, source.archive_path, source.archive_retention_ms) == ("keep", None, None)


def test_an_archiving_files_source_names_its_archive_and_may_bound_its_retention():
    document = files_source(landed_files="archive", archive_path="landed/telemetry", archive_retention="7d")
    source = parse_pipeline(document).source
    assert (source.landed_files, source.archive_path) == ("archive", "landed/telemetry")
    assert source.archive_retention_ms == 7 * 86_400_000


@pytest.mark.parametrize(
    ("fields", "field", "problem"),
    [
        ({"landed_files": "move"}, "source.landed_files", "keep"),
        ({"landed_files": "archive"}, "source.archive_path", "needs the archive's folder"),
        ({"landed_files": "archive", "archive_path": "landing/telemetry"}, "source.archive_path", "landing"),
        ({"landed_files": "delete", "archive_path": "x"}, "source.archive_path", "only with landed_files"),
        ({"archive_retention": "7d"}, "source.archive_retention", "only with landed_files"),
        (
            {"landed_files": "archive", "archive_path": "x", "archive_retention": "0s"},
            "source.archive_retention",
            "",
        ),
    ],
)
def test_a_files_sources_landed_files_setting_that_makes_no_sense_names_its_field(fields, field, problem):
    with pytest.raises(ConfigError) as error:
        parse_pipeline(files_source(**fields))
    assert error.value.field == field and problem in str(error.value)


def test_a_kafka_source_lands_no_files():
    document = telemetry()
    document["source"] = {
        "kind": "kafka",
        "bootstrap_servers": "b:9092",
        "topic": "t",
        "landed_files": "delete",
    }
    with pytest.raises(ConfigError, match=r"only a files source lands files") as error:
        parse_pipeline(document)
    assert error.value.field == "source.landed_files"


SHIPPED = sorted(PIPELINES.glob("*.yaml")) + sorted(
    (PIPELINES.parents[1] / "docs" / "examples").glob("*.yaml")
)
# Values no field of a pipeline file takes: a list of lists, a map of maps, a negative
# number, a boolean.
WRONG_VALUES = ([[]], {"x": {}}, -7, True)


def field_paths(document: dict, prefix: tuple = ()) -> list[tuple]:
    """Every field of a pipeline document, sections and their fields, as key paths."""
    found = []
    for name, value in document.items():
        found.append((*prefix, name))
        if isinstance(value, dict):
            found += field_paths(value, (*prefix, name))
    return found


def names(field: str, dotted: str) -> bool:
    """Whether an error's ``field`` names ``dotted``: the field itself, one inside it
    (``schema.ts``, ``key[0]``), or the section that holds it (a generator's options)."""
    return field == dotted or field.startswith((f"{dotted}.", f"{dotted}[")) or dotted.startswith(f"{field}.")


@pytest.mark.parametrize("shipped", SHIPPED, ids=[path.name for path in SHIPPED])
def test_every_field_of_a_shipped_pipeline_file_given_a_wrong_value_is_refused_naming_it(shipped):
    document = yaml.safe_load(shipped.read_text())
    unnamed = []
    for path in field_paths(document):
        dotted = ".".join(map(str, path))
        for wrong in WRONG_VALUES:
            changed = copy.deepcopy(document)
            section = changed
            for name in path[:-1]:
                section = section[name]
            section[path[-1]] = wrong
            try:
                parse_pipeline(changed)
            except ConfigError as error:
                if not names(error.field, dotted):
                    unnamed.append((dotted, wrong, error.field))
            else:
                unnamed.append((dotted, wrong, "accepted"))
    assert unnamed == []
    assert len(field_paths(document)) >= 12  # the walk reached the file's fields
