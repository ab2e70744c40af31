"""The table registry (DESIGN §3): for a pipeline and a lakehouse root, the path,
SQL name and explicit Delta schema of every table, and an idempotent
create-if-missing.

Tables live at ``<root>/<layer>/<table>`` and are registered in the SQL catalog
as ``<layer>.<table>``. The ``ops`` tables are shared by every pipeline and
carry a ``pipeline`` column. Watermarks are stored as ``bigint`` epoch
milliseconds because a watermark can be -inf/+inf (Long.MIN/MAX), which no
timestamp can hold; use ``timestamp_millis(watermark)`` to read them as time.

Relative paths (the lakehouse root, a files source's landing folder) are
resolved once here, so nothing else joins paths.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DateType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs.config import PipelineConfig
from spark_jobs.eventtime.windows import SessionSpec
from spark_jobs.transforms.aggregates import measure_types
from spark_jobs.transforms.gold import count_column

CHANGE_FEED = ("delta.enableChangeDataFeed", "true")
# Every table's log checkpoint every 100 commits, not Delta's 10. The streams commit
# a few rows at a time, and a checkpoint rebuilds the table's state in Spark jobs:
# every 10 commits they cost more than the commits themselves, while a reader
# rebuilding the state from up to 99 JSON commits is no slower than from a checkpoint.
LOG_CHECKPOINT_INTERVAL = ("delta.checkpointInterval", "100")
# Commits older than an hour leave every table's log at the next checkpoint (Delta's
# default keeps 30 days): each reader lists the log folder, so its length is what a
# micro-batch pays on its hundred-thousandth commit. Delta wants removed files
# remembered no longer than the log. A stream stopped longer than that cannot resume
# reading the commits it missed (docs/decisions/0012-log-retention-one-hour.md).
LOG_RETENTION = ("delta.logRetentionDuration", "interval 1 hours")
REMOVED_FILES_RETENTION = ("delta.deletedFileRetentionDuration", "interval 1 hours")
LAYERS = ("bronze", "silver", "quarantine", "gold", "ops")

SPARK_TYPES: dict[str, DataType] = {
    "string": StringType(),
    "int": IntegerType(),
    "long": LongType(),
    "double": DoubleType(),
    "float": FloatType(),
    "boolean": BooleanType(),
    "timestamp": TimestampType(),
    "date": DateType(),
}


def lakehouse_root(root: str | None = None) -> str:
    """``root``, else ``$LAKEHOUSE_DIR``, else ``./lakehouse``; local paths made absolute."""
    chosen = root or os.environ.get("LAKEHOUSE_DIR") or "lakehouse"
    return chosen.rstrip("/") if "://" in chosen else os.path.abspath(chosen)


def join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts])


@dataclass(frozen=True)
class TableRef:
    layer: str
    name: str
    path: str
    schema: StructType
    partition_by: tuple[str, ...] = ()
    properties: tuple[tuple[str, str], ...] = ()

    @property
    def sql_name(self) -> str:
        return f"{self.layer}.{self.name}"

    @property
    def table_properties(self) -> dict[str, str]:
        """The Delta properties the table is created with: its own over every table's."""
        return dict((LOG_CHECKPOINT_INTERVAL, LOG_RETENTION, REMOVED_FILES_RETENTION, *self.properties))


# One partition's clock in ``ops.watermark_history.partition_clocks``; times in epoch ms.
# Nullable throughout: Delta refuses NOT NULL inside an array.
PARTITION_CLOCKS_TYPE = ArrayType(
    StructType(
        [
            StructField("source_partition", StringType()),
            StructField("max_event_ms", LongType()),
            StructField("partition_watermark", LongType()),
            StructField("last_data_ms", LongType()),
            StructField("is_idle", BooleanType()),
            StructField("is_aligned", BooleanType()),
            # A custom generator's snapshot() as JSON (eventtime.generators).
            StructField("generator_state", StringType()),
        ]
    )
)


def _fields(*columns: tuple[str, DataType] | tuple[str, DataType, bool]) -> list[StructField]:
    return [StructField(column[0], column[1], column[2] if len(column) > 2 else True) for column in columns]


def measure_fields(config: PipelineConfig, with_state: bool) -> list[StructField]:
    """One column per configured measure. ``with_state`` adds the partial state
    that keeps each one mergeable (silver): avg carries its sum and count,
    approx_distinct its HLL sketch."""
    value_types = {column: SPARK_TYPES[config.schema[column]] for column in config.measures}
    return [StructField(name, kind) for name, kind in measure_types(config, value_types, with_state).items()]


def ops_tables(root: str | None = None) -> list[TableRef]:
    """The tables every pipeline shares."""
    root = lakehouse_root(root)
    ts, long, string = TimestampType(), LongType(), StringType()
    specs = {
        "rejects": _fields(
            ("pipeline", string, False),
            ("raw_record", string),
            ("reason", string, False),
            ("detail", string),
            ("source_partition", string),
            ("source_file", string),
            ("source_offset", long),
            ("ingest_time", ts),
            ("rejected_at", ts, False),
        ),
        "watermarks": _fields(
            ("pipeline", string, False),
            ("source_partition", string, False),
            ("max_event_time", ts),
            ("partition_watermark", long, False),
            ("is_idle", BooleanType(), False),
            ("is_aligned", BooleanType(), False),
            ("last_data_at", ts),
            ("batch_id", long),
            ("updated_at", ts, False),
            ("generator_state", string),
        ),
        "watermark_history": _fields(
            ("pipeline", string, False),
            ("batch_id", long, False),
            ("watermark", long, False),
            ("active_partitions", IntegerType(), False),
            ("idle_partitions", IntegerType(), False),
            ("on_time_count", long, False),
            ("late_count", long, False),
            ("processing_time", ts, False),
            # On a step's last row: the partition clocks after it (eventtime.clock_log).
            ("partition_clocks", PARTITION_CLOCKS_TYPE),
        ),
        "runs": _fields(
            ("run_id", string, False),
            ("job", string, False),
            ("pipeline", string, False),
            ("status", string, False),
            ("batches", long),
            ("rows_in", long),
            ("rows_out", long),
            ("late", long),
            ("rejected", long),
            ("started_at", ts, False),
            ("ended_at", ts),
            ("duration_ms", long),
            ("message", string),
        ),
    }
    partitioned = {name: ("pipeline",) for name in specs}
    return [
        TableRef("ops", name, join(root, "ops", name), StructType(fields), partitioned.get(name, ()))
        for name, fields in specs.items()
    ]


def tuning_table(root: str | None = None) -> TableRef:
    """``ops.tuning``: what ``tidemark tune --save`` found, a row per candidate and run
    (``engine.tuning_report.outcome_row``'s figures). Its first save creates it: the
    pipelines' tables come without it."""
    ts, long, string, double = TimestampType(), LongType(), StringType(), DoubleType()
    fields = _fields(
        ("pipeline", string, False),
        ("run_id", string, False),
        ("tuned_at", ts, False),
        ("history", string, False),
        ("candidate", string, False),
        ("pairs", long),
        ("late_pairs", long),
        ("late_share", double),
        ("late_pairs_by_partition", MapType(string, long)),
        ("windows", long),
        ("fired", long),
        ("refired", long),
        ("refire_share", double),
        ("fired_at_end_of_input", long),
        ("delay_event_p50_ms", double),
        ("delay_event_p95_ms", double),
        ("delay_batches_p50", double),
        ("delay_batches_p95", double),
        ("split", long),
        ("merged", long),
    )
    root = lakehouse_root(root)
    return TableRef("ops", "tuning", join(root, "ops", "tuning"), StructType(fields), ("pipeline",))


class TableRegistry:
    """Every table of one pipeline (and the shared ops tables) under one root."""

    def __init__(self, config: PipelineConfig, root: str | None = None) -> None:
        self.config = config
        self.root = lakehouse_root(root)
        self._ops = {table.name: table for table in ops_tables(self.root)}

    def _ref(
        self,
        layer: str,
        name: str,
        fields: list[StructField],
        partition_by: tuple[str, ...] = (),
        properties: tuple[tuple[str, str], ...] = (),
    ) -> TableRef:
        return TableRef(
            layer, name, join(self.root, layer, name), StructType(fields), partition_by, properties
        )

    @property
    def landing_path(self) -> str | None:
        """A files source's landing folder; a relative path lives under the root."""
        return self._under_root(self.config.source.path)

    @property
    def archive_path(self) -> str | None:
        """Where a files source archives what bronze committed (``landed_files: archive``);
        a relative path lives under the root."""
        return self._under_root(self.config.source.archive_path)

    def _under_root(self, path: str | None) -> str | None:
        if path is None or "://" in path or os.path.isabs(path):
            return path
        return join(self.root, path)

    def payload_fields(self) -> list[StructField]:
        return [StructField(name, SPARK_TYPES[type_name]) for name, type_name in self.config.schema.items()]

    def key_fields(self, columns: tuple[str, ...]) -> list[StructField]:
        return [StructField(name, SPARK_TYPES[self.config.schema[name]]) for name in columns]

    def bronze_fields(self) -> list[StructField]:
        ts = TimestampType()
        return self.payload_fields() + _fields(
            ("event_id", StringType(), False),
            ("source_partition", StringType(), False),
            ("source_file", StringType()),
            ("source_offset", LongType(), False),
            ("event_time", ts, False),
            ("ingest_time", ts, False),
            ("processing_time", ts, False),
        )

    @property
    def bronze(self) -> TableRef:
        # Silver reads bronze's change feed: it tags each row with its bronze commit.
        # File statistics only on the columns queries prune by: collecting them for
        # every column (unique ids, long paths) costs bronze much of its write. Not
        # on the key or the source partition: a bronze file holds a micro-batch in
        # arrival order, every key and partition in it, so their bounds prune nothing,
        # and a string's bounds cost a copy of it a row.
        stats_columns = "event_time,ingest_time"
        properties = (CHANGE_FEED, ("delta.dataSkippingStatsColumns", stats_columns))
        return self._ref("bronze", self.config.name, self.bronze_fields(), properties=properties)

    @property
    def silver(self) -> TableRef:
        """``silver.<p>_windows``, or for a session pipeline ``silver.<p>_sessions``."""
        if isinstance(self.config.window, SessionSpec):
            return self._sessions()
        ts = TimestampType()
        fields = (
            _fields(("window_start", ts, False), ("window_end", ts, False))
            + self.key_fields(self.config.key)
            + _fields(("record_count", LongType(), False))
            + measure_fields(self.config, with_state=True)
            + _fields(
                ("revision", IntegerType(), False),
                ("status", StringType(), False),
                ("late_merged_count", LongType(), False),
                ("updated_at", ts, False),
            )
        )
        # Gold reads silver's change feed: the windows that fired, closed or got a revision.
        # Partitioned by status: a micro-batch reads and rewrites the open and fired
        # windows only, never the closed history (transforms.windows.in_play).
        return self._ref(
            "silver",
            f"{self.config.name}_windows",
            fields,
            partition_by=("status",),
            properties=(CHANGE_FEED,),
        )

    def _sessions(self) -> TableRef:
        ts, string = TimestampType(), StringType()
        fields = (
            self.key_fields(self.config.key)
            + _fields(
                ("session_id", string, False),
                ("session_start", ts, False),
                ("session_end", ts, False),
                ("record_count", LongType(), False),
            )
            + measure_fields(self.config, with_state=True)
            + _fields(
                ("revision", IntegerType(), False),
                ("status", string, False),
                ("merged_into", string),
                ("updated_at", ts, False),
                ("tier", string, False),
            )
        )
        # Partitioned by tier: a micro-batch reads and rewrites the live sessions only
        # (engine.session_store), never the history.
        return self._ref(
            "silver",
            f"{self.config.name}_sessions",
            fields,
            partition_by=("tier",),
            properties=(CHANGE_FEED,),
        )

    @property
    def quarantine(self) -> TableRef:
        ts, long = TimestampType(), LongType()
        fields = self.bronze_fields() + _fields(
            ("window_start", ts, False),
            ("window_end", ts, False),
            ("watermark", long, False),
            ("lateness_ms", long, False),
            ("reason", StringType(), False),
            ("status", StringType(), False),
            ("quarantined_at", ts, False),
            ("merged_at", ts),
            ("merge_run_id", StringType()),
        )
        return self._ref("quarantine", f"{self.config.name}_late", fields, ("status",))

    @property
    def gold(self) -> TableRef | None:
        gold = self.config.gold
        if gold is None:
            return None
        ts, long = TimestampType(), LongType()
        fields = (
            _fields(("grain_start", ts, False), ("grain_end", ts, False))
            + self.key_fields(gold.group_by)
            + _fields(
                ("record_count", long, False),
                (count_column(self.config), long, False),
                ("key_count", long, False),
            )
            + measure_fields(self.config, with_state=False)
            + _fields(("updated_at", ts, False))
        )
        return self._ref("gold", f"{self.config.name}_{gold.name}", fields)

    @property
    def status_events(self) -> TableRef | None:
        offline = self.config.offline
        if offline is None:
            return None
        ts = TimestampType()
        fields = self.key_fields(offline.key) + _fields(
            ("status", StringType(), False),
            ("event_time", ts, False),
            ("watermark", LongType(), False),
            ("detected_at", ts, False),
        )
        return self._ref("gold", f"{self.config.name}_status_events", fields)

    @property
    def offline_state(self) -> TableRef | None:
        """Offline detection's state, one table so one commit moves it atomically:
        per key its ``last`` handled track and status, the ``buffered`` tracks the
        watermark has not passed yet, and one ``clock`` row (null key) with the
        watermark and last bronze version the detector has taken in."""
        offline = self.config.offline
        if offline is None:
            return None
        fields = self.key_fields(offline.key) + _fields(
            ("kind", StringType(), False),
            ("ts_ms", LongType(), False),
            ("status", StringType()),
            ("version", LongType()),
            ("updated_at", TimestampType(), False),
        )
        return self._ref("silver", f"{self.config.name}_offline_state", fields)

    @property
    def late_tracks(self) -> TableRef | None:
        """Offline detection's side output: tracks that arrived after the watermark
        had passed them, until the late merge re-derives their keys' statuses."""
        if self.config.offline is None:
            return None
        ts, long = TimestampType(), LongType()
        fields = self.bronze_fields() + _fields(
            ("watermark", long, False),
            ("lateness_ms", long, False),
            ("status", StringType(), False),
            ("quarantined_at", ts, False),
            ("merged_at", ts),
            ("merge_run_id", StringType()),
        )
        return self._ref("quarantine", f"{self.config.name}_late_tracks", fields, ("status",))

    @property
    def ops(self) -> dict[str, TableRef]:
        return dict(self._ops)

    def all(self) -> list[TableRef]:
        own = [
            self.bronze,
            self.silver,
            self.quarantine,
            self.gold,
            self.status_events,
            self.offline_state,
            self.late_tracks,
        ]
        return [table for table in own if table is not None] + list(self._ops.values())
