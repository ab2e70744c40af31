"""The session store: ``silver.<p>_sessions`` (DESIGN §2c), partitioned by ``tier``. A
micro-batch reads and rewrites the ``live`` tier only: the open and fired sessions and
each key's tombstone (its closed session with the latest end). A closed session that a
later one supersedes as the tombstone, and a merged one, move to ``history``, which no
micro-batch reads (DESIGN §4b).

Per micro-batch, each key's records and live sessions meet in one Python function that
runs the reference model's own rules (:class:`~spark_jobs.eventtime.sessions.KeySessions`)
on extents: for each bronze version of the batch in order, it judges the version's
records against the watermark at its start, then settles at the watermark after it. It
says where each record went and what became of each session; the measures are merged
in Spark: a session's are its own state, its new records' partials, and those of the
sessions it absorbed (:func:`~spark_jobs.transforms.aggregates.combined_measures`).

Records reach Python as runs (:func:`numbered`): a key's records of one version whose
proto-sessions chain into one another. A run's records always fall in one group of
touching extents, so they are judged alike and join one session, and the run goes as
its span; only a run that touches the key's tombstone, whose records are judged one
by one, goes as its records. Python so sees about a run per key and version, and its
verdicts return to the records by (key, version, run or member) joins in Spark.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import NamedTuple

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType
from pyspark.sql.window import Window as Frame

from spark_jobs.config import PipelineConfig
from spark_jobs.engine.clocks import VersionClock
from spark_jobs.engine.gold_store import changed_keys
from spark_jobs.eventtime.model import FIRED, OPEN
from spark_jobs.eventtime.sessions import MERGED, KeySessions, Merged, SessionState
from spark_jobs.eventtime.windows import SessionSpec, Window, touches
from spark_jobs.lakehouse.reads import rows_as_of
from spark_jobs.lakehouse.transaction import (
    PartitionWriter,
    Rewrite,
    partition_writer,
    retry_on_conflict,
    rewrite_files,
)
from spark_jobs.session import SHUFFLE_PARTITIONS
from spark_jobs.sql import all_equal_sql
from spark_jobs.tables import SPARK_TYPES, TableRegistry
from spark_jobs.transforms.aggregates import combined_measures, partial_aggregates, state_columns
from spark_jobs.transforms.gold import rolled_up
from spark_jobs.transforms.windows import record_millis

LIVE, HISTORY = "live", "history"
# What the judging function says of one session or record (its ``kind``).
SESSION, JOINED, LATE = "session", "joined", "late"


def proto_end(spec: SessionSpec) -> F.Column:
    """The end of a record's own session, ``ts + gap``, ended at the next cut
    (:meth:`~spark_jobs.eventtime.windows.SessionSpec.proto`)."""
    gap = F.lit(spec.gap_ms) if spec.gap_column is None else F.col(spec.gap_column)
    ts = F.col("ts_ms")
    if spec.max_duration_ms is None:
        return ts + gap.cast("long")
    every = F.lit(spec.max_duration_ms).cast("long")
    return F.least(ts + gap.cast("long"), ts - F.pmod(ts, every) + every)


@dataclass(frozen=True)
class Step:
    """One bronze version of a micro-batch and the watermark before and after it."""

    version: int
    watermark_before: int
    watermark_after: int


def key_schema(config: PipelineConfig) -> str:
    """The key columns as a DDL schema's start."""
    return ", ".join(f"`{name}` {SPARK_TYPES[config.schema[name]].simpleString()}" for name in config.key)


def judged_schema(config: PipelineConfig) -> str:
    return (
        f"{key_schema(config)}, kind string, session_id string, version long, run long, member long,"
        " records long, start_ms long, end_ms long, watermark long, revision int, status string,"
        " merged_into string, tier string, changed boolean, targets array<string>"
    )


@dataclass(frozen=True)
class Limits:
    """What a key's rules take beside its sessions and records."""

    allowed_lateness_ms: int
    max_duration_ms: int | None

    @classmethod
    def of(cls, config: PipelineConfig) -> Limits:
        return cls(config.allowed_lateness_ms, config.window.max_duration_ms)


class _KeyRun:
    """One key's stored sessions (``tier`` and all) as :class:`KeySessions`, and what
    records did to them, until it says so as rows (:meth:`rows`)."""

    def __init__(self, key: tuple, stored: Sequence[tuple], max_duration_ms: int | None) -> None:
        self.before = {
            sid: (SessionState(sid, Window(int(start), int(end)), int(revision), status, merged), tier)
            for sid, start, end, revision, status, merged, tier in stored
        }
        states = (replace(state) for state, _ in self.before.values())
        self.sessions = KeySessions(key, states, max_duration_ms)
        self.survivor_of: dict[str, str] = {}
        self.joined: list[tuple[Arrival, int, str]] = []

    def took(self, merged: Merged, arrivals: Sequence[Arrival], version: int) -> None:
        self.survivor_of |= merged.absorbed
        self.joined += [(arrivals[index], version, session) for index, session in merged.joined.items()]

    def targets(self, session_id: str) -> list[str]:
        """The sessions whose measures take ``session_id``'s: itself and those it merged into."""
        chain = [session_id]
        while chain[-1] in self.survivor_of:
            chain.append(self.survivor_of[chain[-1]])
        return chain

    def rows(self) -> Iterator[dict]:
        """A row per run or record counted (the sessions it counts in) and per session
        (its extent, lifecycle and tier)."""
        for arrival, version, session_id in self.joined:
            yield {"kind": JOINED, **arrival.ids(), "version": version, "targets": self.targets(session_id)}
        tombstone = self.sessions.tombstone()
        for state in self.sessions.sessions.values():
            tier = LIVE if state.status in (OPEN, FIRED) or state is tombstone else HISTORY
            yield {
                "kind": SESSION,
                "session_id": state.session_id,
                "start_ms": state.extent.start,
                "end_ms": state.extent.end,
                "revision": state.revision,
                "status": state.status,
                "merged_into": state.merged_into,
                "tier": tier,
                "changed": self.before.get(state.session_id) != (state, tier),
                "targets": self.targets(state.session_id),
            }


@dataclass(frozen=True)
class Arrival:
    """A run of records (``member`` -1: all of them), or one record of a run (its
    ``member`` number), with its proto-session or span."""

    run: int
    member: int
    records: int
    extent: Window

    def ids(self) -> dict:
        return {"run": self.run, "member": self.member, "records": self.records}


class Unit(NamedTuple):
    """A run of :func:`run_units`, as plain Python values."""

    version: int
    run: int
    start_ms: int
    end_ms: int
    records: int
    first_member: int
    member_ts: Sequence[int]
    member_end: Sequence[int]


def units_by_version(units: Sequence[Unit]) -> dict[int, list[Unit]]:
    """A key's runs per version."""
    found: dict[int, list[Unit]] = {}
    for unit in units:
        found.setdefault(unit.version, []).append(unit)
    return found


def arrivals_of(
    units: Sequence[Unit], tombstone: Window | None, max_duration_ms: int | None
) -> list[Arrival]:
    """Runs as arrivals: whole, or a record at a time where a run touches the
    tombstone (its records are judged one by one)."""
    found = []
    for unit in units:
        span = Window(unit.start_ms, unit.end_ms)
        if tombstone is None or not touches(span, tombstone, max_duration_ms):
            found.append(Arrival(unit.run, -1, unit.records, span))
            continue
        # Members are numbered in order of (ts, end): records that tie have one extent,
        # so they share a verdict, and which member number each takes does not matter.
        ends = sorted(zip(unit.member_ts, unit.member_end, strict=True))
        found += [
            Arrival(unit.run, unit.first_member + index, 1, Window(int(ts), int(end)))
            for index, (ts, end) in enumerate(ends)
        ]
    return found


Firings = Callable[[int, Sequence[SessionState]], None]


def judge_key(
    key: tuple,
    live: Sequence[tuple],
    units: Sequence[Unit],
    steps: Sequence[Step],
    limits: Limits,
    fired: Firings = lambda step, sessions: None,
) -> Iterator[dict]:
    """A micro-batch for one key: its live sessions and its runs, walked version by
    version (judged against the watermark before it, settled at the one after, which
    calls ``fired`` with the step's index and the sessions it fired). Beside
    :meth:`_KeyRun.rows`, a row per run or record quarantined: its extent (a whole
    run's records each keep their own) and the watermark that judged it."""
    run = _KeyRun(key, live, limits.max_duration_ms)
    by_version = units_by_version(units)
    for index, step in enumerate(steps):
        arrived = by_version.get(step.version)
        if arrived is not None:
            tombstone = run.sessions.tombstone()
            arrivals = arrivals_of(arrived, tombstone.extent if tombstone else None, limits.max_duration_ms)
            extents = [arrival.extent for arrival in arrivals]
            judged = run.sessions.judge(extents, step.watermark_before, limits.allowed_lateness_ms)
            run.took(judged, arrivals, step.version)
            for index, extent in judged.late:
                yield {
                    "kind": LATE,
                    **arrivals[index].ids(),
                    "version": step.version,
                    "start_ms": extent.start,
                    "end_ms": extent.end,
                    "watermark": step.watermark_before,
                }
        fired(index, run.sessions.settle(step.watermark_after, limits.allowed_lateness_ms))
    yield from run.rows()


def fold_key(
    key: tuple, stored: Sequence[tuple], units: Sequence[Unit], watermark: int, limits: Limits
) -> Iterator[dict]:
    """The late merge for one key: its quarantined records (as runs) join its sessions,
    closed ones too (:meth:`~spark_jobs.eventtime.sessions.ReferenceSessions.fold_late`),
    and its sessions are settled at ``watermark``."""
    run = _KeyRun(key, stored, limits.max_duration_ms)
    if units:
        alive = [state for state in run.sessions.sessions.values() if state.status != MERGED]
        arrivals = arrivals_of(units, None, limits.max_duration_ms)
        merged = run.sessions.merge(dict(enumerate(arrival.extent for arrival in arrivals)), alive)
        run.took(merged, arrivals, -1)
    run.sessions.settle(watermark, limits.allowed_lateness_ms)
    yield from run.rows()


KeyRule = Callable[[tuple, Sequence[tuple], Sequence[Unit]], Iterator[dict]]
# A stored session as a rule reads it (:class:`_KeyRun`).
STORED = ("session_id", "start_ms", "end_ms", "revision", "status", "merged_into", "tier")


def rows_by_key(frame: pd.DataFrame, key: Sequence[str], fields: Sequence[str]) -> dict[tuple, list[tuple]]:
    """``frame``'s ``fields`` per key, as plain Python values, read a column at a time:
    pandas' row access costs far more than the rules themselves."""
    keys = zip(*(frame[name].tolist() for name in key), strict=True)
    rows = zip(*(frame[name].tolist() for name in fields), strict=True)
    found: dict[tuple, list[tuple]] = {}
    for values, row in zip(keys, rows, strict=True):
        found.setdefault(values, []).append(row)
    return found


def per_key(
    stored_sessions: DataFrame, runs: DataFrame, config: PipelineConfig, rule: KeyRule, schema: str
) -> DataFrame:
    """``rule(key, its stored sessions, its runs)`` (:func:`judge_key`, :func:`fold_key`)
    over every key with sessions or runs (``runs``: :func:`run_units`), as rows of
    ``schema`` (:func:`judged_schema`'s, or another that starts with the key). The keys
    go to Python a shuffle partition's worth at a time, not a key at a time: each call
    costs PySpark milliseconds of its own."""
    key = list(config.key)
    columns = [field.split(" ")[0].strip("`") for field in schema.split(", ")]

    def apply(_: tuple, stored: pd.DataFrame, arrived: pd.DataFrame) -> pd.DataFrame:
        sessions, units = rows_by_key(stored, key, STORED), rows_by_key(arrived, key, Unit._fields)
        rows = []
        # Plain Python key values, as the reference model's keys are: a session's id spells its key.
        for values in sessions.keys() | units.keys():
            named = dict(zip(key, values, strict=True))
            runs = [Unit._make(unit) for unit in units.get(values, [])]
            found = rule(values, sessions.get(values, []), runs)
            # Every value given (None where a row has none) and kept as an object: a
            # column of integers with gaps would otherwise become floats, its gaps NaN.
            rows += [[{**named, **row}.get(column) for column in columns] for row in found]
        return pd.DataFrame(rows, columns=columns, dtype=object)

    spark = stored_sessions.sparkSession
    bucket = F.pmod(F.hash(*key), F.lit(int(spark.conf.get(SHUFFLE_PARTITIONS))))
    stored = stored_sessions.select(
        *key,
        "session_id",
        F.unix_millis("session_start").alias("start_ms"),
        F.unix_millis("session_end").alias("end_ms"),
        "revision",
        "status",
        "merged_into",
        "tier",
    ).withColumn("bucket", bucket)
    units = runs.select(*key, *Unit._fields).withColumn("bucket", bucket)
    return stored.groupBy("bucket").cogroup(units.groupBy("bucket")).applyInPandas(apply, schema)


def numbered(records: DataFrame, config: PipelineConfig) -> DataFrame:
    """Data records (``event_id``, ``version``, ``ts_ms``, ``end_ms``) with their
    ``run`` and ``member`` numbers: per key and version, in order of time, a record
    starts a new run where its time is beyond the ends of those before it (the naive
    sessionization's rule), or at them where that is a cut (``max_duration``), and
    ``member`` counts the records from 0."""
    ordered = Frame.partitionBy(*config.key, "version").orderBy("ts_ms", "end_ms", "event_id")
    reach = F.max("end_ms").over(ordered.rowsBetween(Frame.unboundedPreceding, -1))
    ts = F.col("ts_ms")
    beyond = ts > reach
    every = config.window.max_duration_ms
    if every is not None:
        beyond = beyond | ((ts == reach) & (F.pmod(ts, F.lit(every).cast("long")) == 0))
    starts = F.coalesce(beyond.cast("long"), F.lit(1))
    return (
        records.withColumn("starts_run", starts)
        .withColumn("run", F.sum("starts_run").over(ordered.rowsBetween(Frame.unboundedPreceding, 0)) - 1)
        .withColumn("member", F.row_number().over(ordered).cast("long") - 1)
        .drop("starts_run")
    )


def numbered_data(records: DataFrame, config: PipelineConfig) -> DataFrame:
    """A batch's timed records (:func:`~spark_jobs.engine.judging.timed_records`) as
    :func:`numbered` data records, each with its proto-session's end."""
    return numbered(records.where(~F.col("is_marker")).withColumn("end_ms", proto_end(config.window)), config)


def run_units(records: DataFrame, config: PipelineConfig, measures: bool = True) -> DataFrame:
    """A row per run of :func:`numbered` records: its span, size, first member, its
    records' proto-sessions (read only where it is split), and with ``measures`` its
    records' partial aggregates (one pass over the records for all)."""
    return records.groupBy(*config.key, "version", "run").agg(
        F.min("ts_ms").alias("start_ms"),
        F.max("end_ms").alias("end_ms"),
        F.count(F.lit(1)).alias("records"),
        F.min("member").alias("first_member"),
        # Two lists that one aggregation fills a record at a time, so they stay paired,
        # in no particular order (:func:`arrivals_of` sorts them): a sorted list of
        # structs costs every batch more, for the few runs that are ever split.
        F.collect_list("ts_ms").alias("member_ts"),
        F.collect_list("end_ms").alias("member_end"),
        *(partial_aggregates(config) if measures else ()),
    )


def judged_sessions(
    live_sessions: DataFrame, runs: DataFrame, config: PipelineConfig, steps: Sequence[Step]
) -> DataFrame:
    """:func:`judge_key` over every key with live sessions or runs (:func:`run_units`)."""
    limits = Limits.of(config)
    return per_key(
        live_sessions,
        runs,
        config,
        lambda key, live, arrived: judge_key(key, live, arrived, steps, limits),
        judged_schema(config),
    )


def updated_sessions(
    stored_sessions: DataFrame,
    judged: DataFrame,
    runs: DataFrame,
    records: DataFrame,
    registry: TableRegistry,
    now: datetime,
) -> DataFrame:
    """Every session a judgement (:func:`per_key`, persisted) speaks of, as silver rows:
    measures combined from the states and new records that flow into each (a whole
    run's from ``runs``, :func:`run_units`; a split run's records' from ``records``)."""
    config = registry.config
    key = list(config.key)
    measures = combined_measures(config)
    states = state_columns(config)
    flows = judged.where(F.col("kind") == SESSION).select("session_id", "targets")
    old_states = stored_sessions.join(flows, "session_id").select(
        *key, F.explode("targets").alias("target"), *states
    )
    joined = judged.where(F.col("kind") == JOINED)
    whole, split = verdicts(joined, config, "targets")
    new_states = runs.join(whole, [*key, "version", "run"]).select(
        *key, F.explode("targets").alias("target"), *states
    )
    # Runs are split only where they touch a tombstone: most batches read no record here.
    if not split.isEmpty():
        members = (
            records.join(split, [*key, "version", "member"])
            .groupBy(*key, "version", "member", "targets")
            .agg(*partial_aggregates(config))
        )
        new_states = new_states.unionByName(
            members.select(*key, F.explode("targets").alias("target"), *states)
        )
    combined = (
        old_states.unionByName(new_states)
        .groupBy(*key, "target")
        .agg(*(expression.alias(name) for name, expression in measures.items()))
    )
    sessions = judged.where(F.col("kind") == SESSION).alias("j")
    previous = stored_sessions.select("session_id", F.col("updated_at").alias("previous_update"))
    return (
        sessions.join(combined.drop(*key).alias("c"), F.col("j.session_id") == F.col("c.target"))
        .join(previous, "session_id", "left")
        .select(
            *key,
            "session_id",
            F.timestamp_millis("start_ms").alias("session_start"),
            F.timestamp_millis("end_ms").alias("session_end"),
            *measures,
            "revision",
            "status",
            "merged_into",
            F.when(F.col("changed") | F.col("previous_update").isNull(), F.lit(now).cast("timestamp"))
            .otherwise(F.col("previous_update"))
            .alias("updated_at"),
            "tier",
        )
        .select(*registry.silver.schema.fieldNames())
    )


def verdicts(judged: DataFrame, config: PipelineConfig, *columns: str) -> tuple[DataFrame, DataFrame]:
    """Judged runs and records (``columns`` of their rows), apart: those of whole runs
    (by key, version and run) and those of single records (by key, version and member)."""
    key = list(config.key)
    whole = judged.where(F.col("member") < 0).select(*key, "version", "run", *columns)
    split = judged.where(F.col("member") >= 0).select(*key, "version", "member", *columns)
    return whole, split


def record_schema(registry: TableRegistry) -> StructType:
    """What :func:`numbered` reads of a record."""
    numbers = [StructField(name, LongType()) for name in ("version", "ts_ms", "end_ms")]
    return StructType([*registry.payload_fields(), StructField("event_id", StringType()), *numbers])


def live_writer(registry: TableRegistry) -> PartitionWriter:
    """This process's writer of the live sessions, and the files it knows."""
    return partition_writer(registry.silver.path, "tier", frozenset({LIVE}))


def steps_of(plan: Sequence[VersionClock]) -> list[Step]:
    return [Step(clock.version, clock.watermark_before, clock.watermark_after) for clock in plan]


def replace_live(
    spark: SparkSession,
    registry: TableRegistry,
    records: DataFrame,
    steps: Sequence[Step],
    label: str,
    now: datetime,
    what: str,
) -> DataFrame:
    """Replace the live sessions with what ``records`` (:func:`numbered` data records)
    make of them through ``steps``, in one Delta commit labelled ``label`` (retried on
    a conflict as ``what``); returns the judgement it committed (persisted: the caller
    unpersists it)."""
    config = registry.config
    runs = run_units(records, config).persist()
    judgements: list[DataFrame] = []

    def rows_from(live: DataFrame) -> DataFrame:
        judged = judged_sessions(live, runs, config, steps).persist()
        judgements.append(judged)
        return updated_sessions(live, judged, runs, records, registry, now)

    try:
        retry_on_conflict(lambda: live_writer(registry).overwrite(spark, rows_from, label), what)
    except BaseException:
        for judged in judgements:
            judged.unpersist()
        raise
    finally:
        runs.unpersist()
    for stale in judgements[:-1]:
        stale.unpersist()
    return judgements[-1]


def write_sessions(
    spark: SparkSession,
    registry: TableRegistry,
    records: DataFrame,
    plan: Sequence[VersionClock],
    label: str,
    now: datetime,
) -> DataFrame:
    """Replace the live sessions with what this micro-batch makes of them, in one
    Delta commit labelled ``label``; returns the judgement it committed (persisted:
    the caller unpersists it), whose ``late`` rows are the batch's quarantine.
    ``records``: :func:`numbered` data records."""
    return replace_live(spark, registry, records, steps_of(plan), label, now, "silver sessions write")


def fire_due_sessions(
    spark: SparkSession, registry: TableRegistry, watermark: int, label: str, now: datetime
) -> None:
    """Fire and close the live sessions for a watermark step that brings no records
    (end of input, idleness), in one commit labelled ``label``. Settling twice at one
    watermark changes nothing, so a step repeated after a crash needs no transaction id."""
    no_records = numbered(spark.createDataFrame([], record_schema(registry)), registry.config)
    steps = [Step(-1, watermark, watermark)]
    replace_live(spark, registry, no_records, steps, label, now, "silver sessions firing").unpersist()


def judgement_before(
    spark: SparkSession,
    registry: TableRegistry,
    records: DataFrame,
    plan: Sequence[VersionClock],
    commit: int,
) -> DataFrame:
    """The judgement (persisted) of a micro-batch whose sessions committed as version
    ``commit``: against the live sessions as the version before it left them, which are
    those the commit read (a commit that changed them in between would have failed it)."""
    live = rows_as_of(spark, registry.silver.path, commit - 1, live_writer(registry).predicate)
    runs = run_units(records, registry.config)
    return judged_sessions(live, runs, registry.config, steps_of(plan)).persist()


def late_records(records: DataFrame, judged: DataFrame, config: PipelineConfig) -> DataFrame:
    """The (:func:`numbered`) records the judgement quarantined, with the extent each
    would have had (a whole run's records their own) and the watermark that judged it
    (as :func:`~spark_jobs.engine.judging.quarantine_rows` reads them)."""
    key = list(config.key)
    extent = (F.col("start_ms").alias("window_start_ms"), F.col("end_ms").alias("window_end_ms"))
    whole, split = verdicts(judged.where(F.col("kind") == LATE), config, "watermark", *extent)
    of_runs = (
        records.join(whole.drop("window_start_ms", "window_end_ms"), [*key, "version", "run"])
        .withColumn("window_start_ms", F.col("ts_ms"))
        .withColumn("window_end_ms", F.col("end_ms"))
    )
    return of_runs.unionByName(records.join(split, [*key, "version", "member"]))


def late_keys(late: DataFrame, config: PipelineConfig) -> list[tuple]:
    """The keys of quarantined records (``late``), whose sessions a merge rewrites."""
    return [tuple(row) for row in late.select(*config.key).distinct().collect()]


def of_keys(config: PipelineConfig, keys: Sequence[tuple]) -> str:
    """SQL: a row of one of ``keys``."""
    return " OR ".join(f"({all_equal_sql(config.key, key)})" for key in keys)


def gold_keys_of_sessions(spark: SparkSession, registry: TableRegistry, keys: Sequence[tuple]) -> list:
    """The gold keys (:func:`~spark_jobs.engine.gold_store.changed_keys`) that the
    fired and closed sessions of ``keys`` count in, both tiers."""
    if registry.gold is None or not keys:
        return []
    sessions = spark.read.format("delta").load(registry.silver.path).where(of_keys(registry.config, keys))
    return changed_keys(rolled_up(sessions), registry)


def fold_late_sessions(
    spark: SparkSession,
    registry: TableRegistry,
    late: DataFrame,
    keys: Sequence[tuple],
    watermark: int,
    txn: tuple[str, int],
    label: str,
    now: datetime,
) -> Rewrite | None:
    """The late merge's silver write: quarantined records (``late``, quarantine rows, of
    ``keys``) fold into their keys' sessions (:func:`fold_key`), rewriting the files that
    may hold those keys' sessions, both tiers, in one commit labelled ``label`` under the
    transaction id ``txn``; None when that id had committed already."""
    config = registry.config
    if not keys:
        return None
    records = numbered(
        late.select(
            *config.schema,
            "event_id",
            F.lit(-1).cast("long").alias("version"),
            record_millis(config).alias("ts_ms"),
        ).withColumn("end_ms", proto_end(config.window)),
        config,
    )
    limits = Limits.of(config)

    def fold(key: tuple, stored: Sequence[tuple], arrived: Sequence[Unit]) -> Iterator[dict]:
        return fold_key(key, stored, arrived, watermark, limits)

    runs = run_units(records, config)
    folds: list[DataFrame] = []

    def rows_from(stored: DataFrame) -> DataFrame:
        folded = per_key(stored, runs, config, fold, judged_schema(config)).persist()
        folds.append(folded)
        return updated_sessions(stored, folded, runs, records, registry, now)

    path = registry.silver.path
    try:
        return retry_on_conflict(
            lambda: rewrite_files(spark, path, of_keys(config, keys), rows_from, label, txn),
            "silver write of late records",
            (spark, path),
        )
    finally:
        for folded in folds:
            folded.unpersist()
