"""The pipeline file (DESIGN §3): one YAML file per pipeline, loaded into one
typed, immutable object and validated in one place.

Every error is a :class:`ConfigError` naming the field path (``window.slide``,
``measures.speed``...) and what is wrong with it. Durations are written with a
unit: ``500ms``, ``5s``, ``30m``, ``1h``, ``1d``.
"""

from __future__ import annotations

import functools
import os
import re
import zoneinfo
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from spark_jobs.eventtime.generators import STRATEGIES, GeneratorError, WatermarkSpec
from spark_jobs.eventtime.measures import MEASURES
from spark_jobs.eventtime.model import Rules
from spark_jobs.eventtime.windows import SessionSpec, WindowSpec

# Matched whole (fullmatch): `$` alone would let a trailing newline through.
PIPELINE_NAME = re.compile(r"[a-z][a-z0-9_]*")
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
KAFKA_TOPIC = re.compile(r"[A-Za-z0-9._-]+")
DURATION = re.compile(r"\s*(-?[0-9]+)\s*(ms|s|m|h|d)\s*")
UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
# Names become table names and folders (`<pipeline>_<gold name>`), well below 255 bytes.
MAX_NAME_LENGTH = 64
# The span of the timestamp type (years 1-9999): no window, bound or timeout is longer.
MAX_DURATION_MS = 315_537_897_599_999

SOURCE_KINDS = ("files", "kafka")
FILE_FORMATS = ("json", "csv")
LANDED_FILES = ("keep", "delete", "archive")
EPOCH_FORMATS = ("epoch_seconds", "epoch_millis")
NAMED_TIME_FORMATS = (*EPOCH_FORMATS, "iso8601")
TIME_CHARACTERISTICS = ("event", "ingestion", "processing")
WINDOW_TYPES = ("tumbling", "sliding", "session")
COLUMN_TYPES = ("string", "int", "long", "double", "float", "boolean", "timestamp", "date")
NUMERIC_TYPES = ("int", "long", "double", "float")
NOT_MERGEABLE = ("median", "percentile", "stddev", "variance", "first", "last", "mode", "count_distinct")
# Zones Python's tz database has and Java's (Spark's) has not.
NOT_JAVA_ZONES = frozenset({"localtime", "Factory", "ROC", "posixrules"})
# Columns the tables add beside the payload, and the names the jobs use for their
# own columns while payload and key columns are still beside them. A payload column
# of the same name would be a duplicate column (Spark compares names ignoring case).
RESERVED_COLUMNS = frozenset(
    {
        # bronze
        "event_id",
        "source_partition",
        "source_file",
        "source_offset",
        "event_time",
        "ingest_time",
        "processing_time",
        # quarantine, silver, gold, offline detection
        "window_start",
        "window_end",
        "watermark",
        "lateness_ms",
        "reason",
        "status",
        "quarantined_at",
        "merged_at",
        "merge_run_id",
        "record_count",
        "revision",
        "late_merged_count",
        "updated_at",
        "grain_start",
        "grain_end",
        "window_count",
        "key_count",
        "kind",
        "ts_ms",
        "version",
        "detected_at",
        # while parsing, judging windows, deriving offline transitions
        "raw",
        "text",
        "elements",
        "header",
        "detail",
        "written_to",
        "is_marker",
        "window_start_ms",
        "window_end_ms",
        "watermark_before",
        "is_late",
        "versions",
        "refires",
        "revision_if_new",
        "revision_if_open",
        "action",
        "was_buffered",
        "is_last",
        "event_ms",
        "newest",
        # Spark's and Delta's own
        "_corrupt_record",
        "_metadata",
        "_change_type",
        "_commit_version",
        "_commit_timestamp",
    }
)
# The columns of a session pipeline's silver rows, and those its micro-batch adds
# while judging; a session pipeline's payload must not have them.
SESSION_COLUMNS = frozenset(
    {"session_id", "session_start", "session_end", "merged_into", "tier", "session_count"}
    | {"start_ms", "end_ms", "targets", "target", "changed"}
)
# Columns every silver row has; a measure must not shadow them.
SILVER_RESERVED = (
    "window_start",
    "window_end",
    "record_count",
    "revision",
    "status",
    "late_merged_count",
    "updated_at",
    "session_id",
    "session_start",
    "session_end",
    "merged_into",
    "tier",
)


class ConfigError(ValueError):
    """A pipeline file is wrong; ``field`` is the dotted path of the culprit."""

    def __init__(self, field: str, problem: str, source: str | None = None) -> None:
        self.field = field
        self.problem = problem
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{field}: {problem}")


def parse_duration(value: Any, field: str, allow_zero: bool = True) -> int:
    """``'5s'`` -> 5000 (milliseconds)."""
    if isinstance(value, bool) or not isinstance(value, str):
        raise ConfigError(field, f"expected a duration with a unit such as 500ms, 5s, 30m, 1h; got {value!r}")
    match = DURATION.fullmatch(value)
    if not match:
        raise ConfigError(field, f"expected a duration such as 500ms, 5s, 30m, 1h; got {value!r}")
    amount = int(match.group(1)) * UNIT_MS[match.group(2)]
    if amount < 0:
        raise ConfigError(field, f"must not be negative; got {value!r}")
    if amount > MAX_DURATION_MS:
        raise ConfigError(field, f"must not exceed the timestamp range (about 10,000 years); got {value!r}")
    if amount == 0 and not allow_zero:
        raise ConfigError(field, f"must be positive; got {value!r}")
    return amount


@dataclass(frozen=True)
class SourceConfig:
    kind: str
    path: str | None = None
    format: str = "json"
    bootstrap_servers: str | None = None
    topic: str | None = None
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    max_files_per_trigger: int | None = None
    partitions: tuple[str, ...] = ()
    landed_files: str = "keep"
    archive_path: str | None = None
    archive_retention_ms: int | None = None


@dataclass(frozen=True)
class EventTimeConfig:
    column: str
    format: str
    timezone: str = "UTC"
    max_future_skew_ms: int = 3_600_000

    @property
    def is_epoch(self) -> bool:
        return self.format in EPOCH_FORMATS


@dataclass(frozen=True)
class GoldConfig:
    name: str
    grain_ms: int
    group_by: tuple[str, ...]


@dataclass(frozen=True)
class OfflineConfig:
    timeout_ms: int
    key: tuple[str, ...]


@dataclass(frozen=True)
class PipelineConfig:
    name: str
    source: SourceConfig
    schema: Mapping[str, str]
    event_time: EventTimeConfig
    key: tuple[str, ...]
    watermark: WatermarkSpec
    window: WindowSpec | SessionSpec
    time_characteristic: str = "event"
    partition_column: str | None = None
    allowed_lateness_ms: int = 0
    measures: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    gold: GoldConfig | None = None
    offline: OfflineConfig | None = None
    source_file: str | None = None

    @property
    def measure_columns(self) -> list[str]:
        return [f"{column}_{fn}" for column, functions in self.measures.items() for fn in functions]

    def rules(self, partitions: tuple = ()) -> Rules:
        """The event-time rules of this pipeline, as the reference model takes them."""
        return Rules(
            window=self.window,
            watermark=self.watermark,
            allowed_lateness_ms=self.allowed_lateness_ms,
            key=self.key,
            measures=self.measures,
            partitions=partitions,
        )


Built = TypeVar("Built")


def once_per_pipeline(build: Callable[..., Built]) -> Callable[..., Built]:
    """``build(config, *choices)`` (the choices hashable) memoised by the config's
    identity, a config not being hashable: the Spark columns a micro-batch is made of
    are built on a pipeline's first batch in a process, not on every batch (each costs
    JVM calls). The memo holds the config, so that its id is never given to another."""
    built: dict[tuple[Hashable, ...], tuple[PipelineConfig, Built]] = {}

    @functools.wraps(build)
    def memoised(config: PipelineConfig, *choices: Hashable) -> Built:
        key = (id(config), *choices)
        if key not in built:
            built[key] = (config, build(config, *choices))
        return built[key][1]

    return memoised


SHIPPED_PIPELINES = Path(__file__).resolve().parent / "pipelines"
PIPELINE_HELP = (
    "pipeline YAML file, or a configured pipeline's name (a file in $TIDEMARK_PIPELINES, else a shipped one)"
)


def configured_pipeline_files(entries: str | None = None) -> dict[str, str]:
    """Pipeline file stem -> YAML file, from ``entries`` (files or folders,
    colon-separated), else ``$TIDEMARK_PIPELINES``, else the shipped pipelines. An
    entry that is neither is an error naming it (a typo there would otherwise hide
    every pipeline behind a misleading "no configured pipeline")."""
    entries = entries or os.environ.get("TIDEMARK_PIPELINES") or str(SHIPPED_PIPELINES)
    found: dict[str, str] = {}
    for entry in filter(None, entries.split(":")):
        path = Path(entry)
        if not path.exists():
            raise ConfigError("TIDEMARK_PIPELINES", f"no file or folder {entry!r}")
        files = sorted(path.glob("*.yaml")) if path.is_dir() else [path]
        for file in files:
            found[file.stem] = str(file)
    return found


def pipeline_path(reference: str | Path) -> Path:
    """``reference`` as a pipeline file: a path to one, or the name of a configured
    pipeline (a file's stem in :func:`configured_pipeline_files`). A path wins: a
    name is looked up only when no such file exists and it names no folder or YAML."""
    path = Path(reference)
    if path.is_file() or path.suffix in (".yaml", ".yml") or path.parent != Path("."):
        return path
    configured = configured_pipeline_files()
    if path.name in configured:
        return Path(configured[path.name])
    names = ", ".join(sorted(configured)) or "none"
    problem = f"no file {str(reference)!r} and no configured pipeline of that name (configured: {names})"
    raise ConfigError("--pipeline", problem)


def load_pipeline(path: str | Path) -> PipelineConfig:
    """Read and validate one pipeline file, given by its path or its configured name."""
    path = pipeline_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError("<file>", f"cannot read {path}: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(
            "<file>", f"not UTF-8 text ({error.reason} at byte {error.start})", str(path)
        ) from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError("<file>", f"not valid YAML: {error}", str(path)) from None
    except RecursionError:  # PyYAML builds nested collections recursively
        raise ConfigError("<file>", "nested too deeply to be a pipeline file", str(path)) from None
    try:
        return parse_pipeline(document, source_file=str(path))
    except ConfigError as error:
        raise ConfigError(error.field, error.problem, str(path)) from None


def parse_pipeline(document: Any, source_file: str | None = None) -> PipelineConfig:
    """Validate a parsed YAML document; raises :class:`ConfigError`."""
    top = _mapping(document, "<root>")
    known = {
        "pipeline",
        "source",
        "schema",
        "event_time",
        "time_characteristic",
        "partition_column",
        "key",
        "watermark",
        "window",
        "allowed_lateness",
        "measures",
        "gold",
        "offline",
    }
    _reject_unknown(top, known, "")
    name = _table_name(_required(top, "pipeline", ""), "pipeline", "it prefixes table names")

    schema = _schema(_required(top, "schema", ""))
    source = _source(_required(top, "source", ""))
    event_time = _event_time(_required(top, "event_time", ""), schema)
    characteristic = top.get("time_characteristic", "event")
    _one_of(characteristic, TIME_CHARACTERISTICS, "time_characteristic")

    partition_column = top.get("partition_column")
    if partition_column is not None:
        _column(partition_column, schema, "partition_column")
    elif source.kind == "files":
        raise ConfigError(
            "partition_column",
            "required for a files source (the column naming each record's source partition)",
        )

    if partition_column is not None and schema[partition_column] in ("int", "long"):
        for partition in source.partitions:
            if not re.fullmatch(r"-?[0-9]+", partition):
                raise ConfigError(
                    "source.partitions",
                    f"{partition!r} can never be a value of the {schema[partition_column]} "
                    f"partition column {partition_column!r}",
                )

    key = _columns(_required(top, "key", ""), schema, "key")
    watermark = parse_watermark(_required(top, "watermark", ""), schema, source_file)
    window = _window(_required(top, "window", ""), schema)
    if isinstance(window, SessionSpec):
        for column in schema:
            if column.lower() in SESSION_COLUMNS:
                raise ConfigError(f"schema.{column}", "a session pipeline's silver uses this name itself")
    lateness = parse_duration(top.get("allowed_lateness", "0s"), "allowed_lateness")
    measures = _measures(top.get("measures") or {}, schema, key)
    gold = _gold(top["gold"], key, window) if top.get("gold") is not None else None
    offline = _offline(top["offline"], key, schema) if top.get("offline") is not None else None
    return PipelineConfig(
        name=name,
        source=source,
        schema=schema,
        event_time=event_time,
        key=key,
        watermark=watermark,
        window=window,
        time_characteristic=characteristic,
        partition_column=partition_column,
        allowed_lateness_ms=lateness,
        measures=measures,
        gold=gold,
        offline=offline,
        source_file=source_file,
    )


def _table_name(value: Any, field: str, why: str) -> str:
    if not isinstance(value, str) or not PIPELINE_NAME.fullmatch(value) or len(value) > MAX_NAME_LENGTH:
        raise ConfigError(
            field, f"must match [a-z][a-z0-9_]*, at most {MAX_NAME_LENGTH} characters ({why}); got {value!r}"
        )
    return value


def _mapping(value: Any, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(field, f"expected a mapping; got {type(value).__name__}")
    return value


def _required(section: Mapping[str, Any], name: str, prefix: str) -> Any:
    path = f"{prefix}{name}"
    if name not in section or section[name] is None:
        raise ConfigError(path, "is required")
    return section[name]


def _reject_unknown(section: Mapping[str, Any], known: set[str], prefix: str) -> None:
    for name in section:
        if name not in known:
            # A name that is empty or odd is shown quoted, so the message points at it.
            label = name if isinstance(name, str) and IDENTIFIER.fullmatch(name) else repr(name)
            raise ConfigError(
                f"{prefix}{label}", f"unknown field; expected one of {', '.join(sorted(known))}"
            )


def _one_of(value: Any, allowed: tuple[str, ...], field: str) -> str:
    if value not in allowed:
        raise ConfigError(field, f"unknown value {value!r}; expected one of {', '.join(allowed)}")
    return value


def _positive_int(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(field, f"expected a positive integer; got {value!r}")
    return value


def _column(name: Any, schema: Mapping[str, str], field: str) -> str:
    if not isinstance(name, str) or name not in schema:
        raise ConfigError(field, f"{name!r} is not a column of the schema ({', '.join(schema)})")
    return name


def _columns(value: Any, schema: Mapping[str, str], field: str) -> tuple[str, ...]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names:
        raise ConfigError(field, "expected a non-empty list of column names")
    for index, name in enumerate(names):
        _column(name, schema, f"{field}[{index}]")
    if len(set(names)) != len(names):
        raise ConfigError(field, f"lists a column twice: {names}")
    return tuple(names)


def _schema(value: Any) -> dict[str, str]:
    section = _mapping(value, "schema")
    if not section:
        raise ConfigError("schema", "must name at least one column")
    schema = {}
    seen: dict[str, str] = {}
    for name, type_name in section.items():
        field = f"schema.{name}"
        if not isinstance(name, str) or not IDENTIFIER.fullmatch(name):
            raise ConfigError(field, "column names must match [A-Za-z_][A-Za-z0-9_]*")
        if name.lower() in RESERVED_COLUMNS:
            raise ConfigError(
                field, f"{name!r} is a column name Tidemark uses itself; the payload cannot have it"
            )
        if name.lower() in seen:
            raise ConfigError(field, f"same column as {seen[name.lower()]!r} (Spark ignores case in names)")
        seen[name.lower()] = name
        schema[name] = _one_of(type_name, COLUMN_TYPES, field)
    return schema


def _source(value: Any) -> SourceConfig:
    section = _mapping(value, "source")
    known = {
        "kind",
        "path",
        "format",
        "bootstrap_servers",
        "topic",
        "starting_offsets",
        "max_offsets_per_trigger",
        "max_files_per_trigger",
        "partitions",
        "landed_files",
        "archive_path",
        "archive_retention",
    }
    _reject_unknown(section, known, "source.")
    kind = _one_of(_required(section, "kind", "source."), SOURCE_KINDS, "source.kind")
    limits = {}
    for limit in ("max_offsets_per_trigger", "max_files_per_trigger"):
        if section.get(limit) is not None:
            limits[limit] = _positive_int(section[limit], f"source.{limit}")
    if kind == "files":
        path = _required(section, "path", "source.")
        if not isinstance(path, str) or not path.strip():
            raise ConfigError("source.path", "expected a folder path")
        file_format = _one_of(section.get("format", "json"), FILE_FORMATS, "source.format")
        partitions = _declared_partitions(section.get("partitions"))
        landed = _landed_files(section)
        return SourceConfig(
            kind=kind, path=path, format=file_format, partitions=partitions, **landed, **limits
        )
    for name in ("landed_files", "archive_path", "archive_retention"):
        if section.get(name) is not None:
            raise ConfigError(f"source.{name}", "only a files source lands files")
    if section.get("partitions") is not None:
        raise ConfigError("source.partitions", "a Kafka source reports its topic's partitions itself")
    servers = _required(section, "bootstrap_servers", "source.")
    topic = _required(section, "topic", "source.")
    if not isinstance(servers, str) or not servers.strip():
        raise ConfigError("source.bootstrap_servers", "expected host:port[,host:port...]")
    if not isinstance(topic, str) or not KAFKA_TOPIC.fullmatch(topic):
        raise ConfigError("source.topic", f"not a valid Kafka topic name: {topic!r}")
    offsets = _one_of(
        section.get("starting_offsets", "earliest"), ("earliest", "latest"), "source.starting_offsets"
    )
    return SourceConfig(
        kind=kind, bootstrap_servers=servers, topic=topic, starting_offsets=offsets, format="json", **limits
    )


def _landed_files(section: Mapping[str, Any]) -> dict[str, Any]:
    """What becomes of a landed file once bronze has committed it: ``keep`` it, ``delete``
    it, or ``archive`` it under ``archive_path``, where maintenance deletes archived files
    older than ``archive_retention`` (kept for ever without one)."""
    landed = _one_of(section.get("landed_files", "keep"), LANDED_FILES, "source.landed_files")
    archive, retention = section.get("archive_path"), section.get("archive_retention")
    if landed == "archive":
        if not isinstance(archive, str) or not archive.strip():
            raise ConfigError("source.archive_path", "landed_files: archive needs the archive's folder")
        if archive.rstrip("/") == str(section.get("path", "")).rstrip("/"):
            raise ConfigError("source.archive_path", "must not be the landing folder itself")
    else:
        for name, value in (("archive_path", archive), ("archive_retention", retention)):
            if value is not None:
                raise ConfigError(f"source.{name}", f"only with landed_files: archive; got {landed}")
    retention_ms = None if retention is None else parse_duration(retention, "source.archive_retention", False)
    return {"landed_files": landed, "archive_path": archive, "archive_retention_ms": retention_ms}


def _declared_partitions(value: Any) -> tuple[str, ...]:
    """``source.partitions``: a count (partitions ``0`` to ``n - 1``) or a list of
    values, as the partition column holds them."""
    if value is None:
        return ()
    if isinstance(value, int) and not isinstance(value, bool):
        return tuple(str(index) for index in range(_positive_int(value, "source.partitions")))
    if not isinstance(value, list) or not value:
        raise ConfigError(
            "source.partitions", f"expected a count or a non-empty list of values; got {value!r}"
        )
    if any(isinstance(item, bool) or not isinstance(item, str | int) for item in value):
        raise ConfigError("source.partitions", f"values must be strings or integers; got {value!r}")
    names = tuple(str(item) for item in value)
    if len(set(names)) != len(names):
        raise ConfigError("source.partitions", f"lists a partition twice: {value!r}")
    return names


def _event_time(value: Any, schema: Mapping[str, str]) -> EventTimeConfig:
    section = _mapping(value, "event_time")
    _reject_unknown(section, {"column", "format", "timezone", "max_future_skew"}, "event_time.")
    column = _column(_required(section, "column", "event_time."), schema, "event_time.column")
    time_format = _required(section, "format", "event_time.")
    if not isinstance(time_format, str) or not time_format.strip():
        raise ConfigError(
            "event_time.format", "expected epoch_seconds, epoch_millis, iso8601 or a datetime pattern"
        )
    if time_format not in NAMED_TIME_FORMATS and "y" not in time_format and "u" not in time_format:
        raise ConfigError(
            "event_time.format",
            f"unknown format {time_format!r}; expected epoch_seconds, epoch_millis, iso8601 "
            "or a Spark datetime pattern with a year, such as 'yyyy-MM-dd HH:mm:ss'",
        )
    column_type = schema[column]
    if time_format in EPOCH_FORMATS:
        if column_type not in (*NUMERIC_TYPES, "string"):
            raise ConfigError(
                "event_time.column",
                f"{time_format} needs a numeric or string column; {column} is {column_type}",
            )
    elif column_type != "string":
        raise ConfigError(
            "event_time.column", f"format {time_format!r} parses text; {column} is {column_type}"
        )
    timezone = section.get("timezone", "UTC")
    # A region name from the tz database, as Spark takes it (not a file zoneinfo
    # happens to find, such as localtime or posix/...).
    if not isinstance(timezone, str) or timezone in NOT_JAVA_ZONES or timezone not in _zone_names():
        raise ConfigError(
            "event_time.timezone",
            f"unknown time zone {timezone!r}; expected a name such as Europe/Paris or UTC",
        )
    skew = parse_duration(
        section.get("max_future_skew", "1h"), "event_time.max_future_skew", allow_zero=False
    )
    return EventTimeConfig(column=column, format=time_format, timezone=timezone, max_future_skew_ms=skew)


@functools.cache
def _zone_names() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def parse_watermark(value: Any, schema: Mapping[str, str], source_file: str | None = None) -> WatermarkSpec:
    """A pipeline file's `watermark` section, checked (ConfigError names the field)."""
    section = _mapping(value, "watermark")
    _reject_unknown(
        section,
        {"strategy", "max_out_of_orderness", "idleness", "marker_column", "generator", "options"},
        "watermark.",
    )
    strategy = _one_of(_required(section, "strategy", "watermark."), STRATEGIES, "watermark.strategy")
    bound = 0
    if strategy == "bounded":
        bound = parse_duration(
            _required(section, "max_out_of_orderness", "watermark."), "watermark.max_out_of_orderness"
        )
    elif "max_out_of_orderness" in section:
        raise ConfigError(
            "watermark.max_out_of_orderness", f"only applies to the bounded strategy, not {strategy}"
        )
    marker = None
    if strategy == "punctuated":
        marker = _column(_required(section, "marker_column", "watermark."), schema, "watermark.marker_column")
    elif strategy == "custom" and "marker_column" in section:
        marker = _column(section["marker_column"], schema, "watermark.marker_column")
    elif "marker_column" in section:
        raise ConfigError(
            "watermark.marker_column", f"only applies to the punctuated and custom strategies, not {strategy}"
        )
    for custom_only in ("generator", "options"):
        if strategy != "custom" and custom_only in section:
            raise ConfigError(
                f"watermark.{custom_only}", f"only applies to the custom strategy, not {strategy}"
            )
    idleness = None
    if section.get("idleness") is not None:
        idleness = parse_duration(section["idleness"], "watermark.idleness", allow_zero=False)
    spec = WatermarkSpec(
        strategy=strategy,
        max_out_of_orderness_ms=bound,
        idleness_ms=idleness,
        marker_column=marker,
        **(_custom_generator(section, source_file) if strategy == "custom" else {}),
    )
    if spec.generator is not None:
        # Built once here, so a missing class, refused options or a wrong shape fail
        # before Spark starts.
        try:
            spec.new_generator()
        except GeneratorError as error:
            raise ConfigError(f"watermark.{error.field}", str(error)) from None
    return spec


def _custom_generator(section: Mapping[str, Any], source_file: str | None) -> dict[str, Any]:
    """The custom strategy's class reference and options; a module beside the
    pipeline file is found."""
    reference = _required(section, "generator", "watermark.")
    if not isinstance(reference, str):
        raise ConfigError("watermark.generator", f"expected 'package.module:Class'; got {reference!r}")
    options = section.get("options") or {}
    if not isinstance(options, Mapping) or not all(isinstance(key, str) for key in options):
        raise ConfigError("watermark.options", f"expected a mapping of keyword arguments; got {options!r}")
    folder = str(Path(source_file).resolve().parent) if source_file else None
    return {"generator": reference, "options": dict(options), "search_folder": folder}


def _window(value: Any, schema: Mapping[str, str]) -> WindowSpec | SessionSpec:
    section = _mapping(value, "window")
    window_type = _one_of(_required(section, "type", "window."), WINDOW_TYPES, "window.type")
    if window_type == "session":
        return _session_window(section, schema)
    _reject_unknown(section, {"type", "size", "slide", "offset"}, "window.")
    size = parse_duration(_required(section, "size", "window."), "window.size", allow_zero=False)
    if window_type == "sliding":
        slide = parse_duration(_required(section, "slide", "window."), "window.slide", allow_zero=False)
        if slide > size:
            raise ConfigError(
                "window.slide", f"must not exceed window.size ({section['slide']} > {section['size']})"
            )
    elif "slide" in section:
        raise ConfigError("window.slide", "only applies to sliding windows")
    else:
        slide = size
    offset = parse_duration(section.get("offset", "0s"), "window.offset")
    if offset >= slide:
        raise ConfigError(
            "window.offset",
            f"must be smaller than the window {'slide' if window_type == 'sliding' else 'size'}",
        )
    return WindowSpec(size_ms=size, slide_ms=slide, offset_ms=offset)


def _session_window(section: Mapping[str, Any], schema: Mapping[str, str]) -> SessionSpec:
    """A fixed ``gap``, or a per-record ``gap_column`` (milliseconds) bounded by ``max_gap``."""
    _reject_unknown(section, {"type", "gap", "gap_column", "max_gap", "max_duration"}, "window.")
    if ("gap" in section) == ("gap_column" in section):
        raise ConfigError("window.gap", "a session window takes either gap or gap_column")
    max_duration = None
    if "max_duration" in section:
        max_duration = parse_duration(section["max_duration"], "window.max_duration", allow_zero=False)
    if "gap" in section:
        if "max_gap" in section:
            raise ConfigError(
                "window.max_gap", "only applies with a gap_column (a fixed gap is its own bound)"
            )
        gap = parse_duration(section["gap"], "window.gap", allow_zero=False)
        return SessionSpec(gap_ms=gap, max_duration_ms=max_duration)
    column = _column(section["gap_column"], schema, "window.gap_column")
    if schema[column] not in ("int", "long"):
        raise ConfigError(
            "window.gap_column",
            f"must be an int or long column of milliseconds; {column} is {schema[column]}",
        )
    max_gap = parse_duration(_required(section, "max_gap", "window."), "window.max_gap", allow_zero=False)
    return SessionSpec(gap_column=column, max_gap_ms=max_gap, max_duration_ms=max_duration)


def _measures(value: Any, schema: Mapping[str, str], key: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    section = _mapping(value, "measures")
    taken = {name.lower() for name in (*SILVER_RESERVED, *key)}
    measures = {}
    for column, functions in section.items():
        field = f"measures.{column}"
        _column(column, schema, field)
        names = [functions] if isinstance(functions, str) else functions
        if not isinstance(names, list) or not names:
            raise ConfigError(field, f"expected a list of aggregates from {', '.join(MEASURES)}")
        for function in names:
            if function in NOT_MERGEABLE:
                raise ConfigError(
                    field,
                    f"{function!r} is not mergeable, so late records could not be folded in later; "
                    f"use one of {', '.join(MEASURES)}",
                )
            _one_of(function, tuple(MEASURES), field)
            if MEASURES[function].numeric_only and schema[column] not in NUMERIC_TYPES:
                raise ConfigError(field, f"{function} needs a numeric column; {column} is {schema[column]}")
            if f"{column}_{function}".lower() in taken:
                raise ConfigError(field, f"{column}_{function} would shadow a silver column")
        if len(set(names)) != len(names):
            raise ConfigError(field, f"lists an aggregate twice: {names}")
        measures[column] = tuple(names)
    return measures


def _gold(value: Any, key: tuple[str, ...], window: WindowSpec | SessionSpec) -> GoldConfig:
    section = _mapping(value, "gold")
    _reject_unknown(section, {"name", "grain", "group_by"}, "gold.")
    name = _table_name(_required(section, "name", "gold."), "gold.name", "it names the gold table")
    if isinstance(window, WindowSpec) and not window.is_tumbling:
        raise ConfigError(
            "gold", "a rollup needs tumbling windows (sliding windows overlap and would count records twice)"
        )
    grain = parse_duration(_required(section, "grain", "gold."), "gold.grain", allow_zero=False)
    # A session counts in the grain it starts in, so any grain will do.
    if isinstance(window, WindowSpec) and (grain % window.size_ms or grain < window.size_ms):
        raise ConfigError("gold.grain", "must be a whole multiple of window.size")
    group_by = section.get("group_by", [])
    if not isinstance(group_by, list):
        raise ConfigError("gold.group_by", "expected a list of key columns")
    for index, column in enumerate(group_by):
        if column not in key:
            raise ConfigError(f"gold.group_by[{index}]", f"{column!r} is not a key column ({', '.join(key)})")
    if len(set(group_by)) != len(group_by):
        raise ConfigError("gold.group_by", f"lists a column twice: {group_by}")
    return GoldConfig(name=name, grain_ms=grain, group_by=tuple(group_by))


def _offline(value: Any, key: tuple[str, ...], schema: Mapping[str, str]) -> OfflineConfig:
    section = _mapping(value, "offline")
    _reject_unknown(section, {"timeout", "key"}, "offline.")
    timeout = parse_duration(_required(section, "timeout", "offline."), "offline.timeout", allow_zero=False)
    offline_key = _columns(section["key"], schema, "offline.key") if section.get("key") is not None else key
    return OfflineConfig(timeout_ms=timeout, key=offline_key)
