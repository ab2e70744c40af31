"""What-if over history (DESIGN §2b, ``tidemark tune``): for candidate watermark
settings, exactly what silver would do over the same bronze versions, without a
replay per candidate.

Silver's clock depends only on a small per-version, per-partition summary, so one
Spark pass computes that summary and every candidate's tracker steps through it on
the driver, through the very planning silver uses (``plan_clocks``), as one silver
pass over the whole bronze table would (a backfill from a fresh checkpoint). One more
pass judges every (record, window) pair against every candidate's watermark at once.

Per candidate it reports the pairs quarantined (in total and per partition), the
windows silver would hold, how many fired and re-fired, and how long after a
window's end its first firing came: in event time (the newest event time the
pipeline had seen at that step, less the window's end) and in micro-batches of
arrival (from the first step whose data reached the window's end).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.config import DURATION, ConfigError, PipelineConfig, parse_duration, parse_watermark
from spark_jobs.engine.clocks import VersionClock, plan_clocks
from spark_jobs.engine.judging import read_bronze_history, timed_records, version_summary
from spark_jobs.eventtime.clock import MAX_WATERMARK, MIN_WATERMARK
from spark_jobs.eventtime.generators import WatermarkSpec
from spark_jobs.eventtime.tracker import WatermarkTracker
from spark_jobs.lakehouse.log import table_version
from spark_jobs.sources import source_reports
from spark_jobs.sql import local_rows
from spark_jobs.tables import TableRegistry
from spark_jobs.transforms.windows import assign_windows, is_cleaned, is_fired

QUANTILES = (0.5, 0.95)


@dataclass(frozen=True)
class Candidate:
    """A watermark setting to try: a strategy (with its generator) and the allowed
    lateness, and for a session pipeline the gap (None: the pipeline's own)."""

    label: str
    watermark: WatermarkSpec
    allowed_lateness_ms: int
    gap_ms: int | None = None


@dataclass(frozen=True)
class Outcome:
    """What silver would do under one candidate. ``delay_*``: the (median, p95) of the
    first firings before the end of input, None when no window fired. For sessions a
    pair is a record and a window a session (merged ones aside), and ``split`` counts
    the sessions of all records at once that silver holds in pieces, ``merged`` the
    sessions silver created and later merged into another."""

    label: str
    pairs: int
    quarantined: int
    quarantined_by_partition: dict[str, int]
    windows: int
    fired: int
    refired: int
    fired_at_end: int
    delay_event_ms: tuple[float, float] | None
    delay_batches: tuple[float, float] | None
    split: int | None = None
    merged: int | None = None

    @property
    def late_share(self) -> float:
        return self.quarantined / self.pairs if self.pairs else 0.0

    @property
    def refire_share(self) -> float:
        return self.refired / self.fired if self.fired else 0.0


@dataclass
class Tuning:
    """The candidates' outcomes, their watermark steps, and per (window, key) when
    each candidate first fired it (``windows``; null when it never did)."""

    candidates: list[Candidate]
    outcomes: list[Outcome]
    steps: list[list[VersionClock]]
    windows: DataFrame = field(repr=False)


class CannotTune(ValueError):
    """The pipeline's bronze history holds no record, or cannot be read whole."""


CANDIDATE = re.compile(r"(?P<strategy>[^()+]+?)\s*(?:\((?P<options>.*)\))?\s*(?:\+(?P<lateness>[^+()]+))?")
CANDIDATE_HELP = (
    "a bound (5s), a bound plus allowed lateness (5s+30s), monotonous, the pipeline's own "
    "setting (pipeline), or a generator class with options "
    "(spark_jobs.eventtime.adaptive:AdaptiveBound(floor=2s,ceiling=1m)+30s)"
)


def parse_candidate(text: str, config: PipelineConfig) -> Candidate:
    """One ``--candidates`` entry: the watermark and allowed lateness to try. The
    pipeline's idleness (and marker column) go with every candidate; without ``+L``
    the pipeline's allowed lateness does."""
    match = CANDIDATE.fullmatch(text.strip())
    if match is None:
        raise ConfigError("--candidates", f"{text!r}: expected {CANDIDATE_HELP}")
    strategy, options, lateness = match["strategy"].strip(), match["options"], match["lateness"]
    allowed = config.allowed_lateness_ms
    if lateness is not None:
        allowed = parse_duration(lateness.strip(), f"--candidates {text!r}: allowed lateness")
    common = {"idleness": None}
    if config.watermark.idleness_ms is not None:
        common["idleness"] = f"{config.watermark.idleness_ms}ms"
    if config.watermark.marker_column is not None:
        common["marker_column"] = config.watermark.marker_column
    if strategy == "pipeline" and options is None:
        return Candidate(text.strip(), config.watermark, allowed)
    if strategy == "monotonous" and options is None:
        section: dict[str, Any] = {"strategy": "monotonous"}
    elif ":" in strategy:
        section = {"strategy": "custom", "generator": strategy, "options": candidate_options(options, text)}
    elif options is None and DURATION.fullmatch(strategy):
        section = {"strategy": "bounded", "max_out_of_orderness": strategy}
    else:
        raise ConfigError("--candidates", f"{text!r}: expected {CANDIDATE_HELP}")
    if section["strategy"] != "custom" and "marker_column" in common:
        raise ConfigError(
            "--candidates",
            f"{text!r}: the pipeline's records carry punctuation markers (watermark.marker_column), "
            "which a bound would take for data; try pipeline or a generator class",
        )
    try:
        spec = parse_watermark({**section, **common}, config.schema, config.source_file)
    except ConfigError as error:
        raise ConfigError("--candidates", f"{text!r}: {error.field}: {error.problem}") from None
    return Candidate(text.strip(), spec, allowed)


def candidate_options(options: str | None, text: str) -> dict[str, Any]:
    """``floor=2s, ceiling=1m`` -> keyword arguments, each value read as YAML
    (``0.99`` is a number, ``2s`` a string)."""
    if not options or not options.strip():
        return {}
    parsed = {}
    for item in options.split(","):
        key, equals, value = item.partition("=")
        if not equals or not key.strip().isidentifier():
            raise ConfigError(
                "--candidates", f"{text!r}: expected options as name=value, got {item.strip()!r}"
            )
        try:
            parsed[key.strip()] = yaml.safe_load(value.strip())
        except yaml.YAMLError:
            raise ConfigError("--candidates", f"{text!r}: cannot read the value of {key.strip()!r}") from None
    return parsed


def candidate_steps(
    candidate: Candidate, summary: Sequence, reports: dict, flush: bool, end_ms: int
) -> list[VersionClock]:
    """The candidate's watermark step per bronze version, as one silver pass over them
    all plans it; with ``flush``, the end of input after them (watermark +inf)."""
    plan = plan_clocks(WatermarkTracker(candidate.watermark), summary, set(), reports)
    if flush:
        last = plan[-1]
        plan.append(VersionClock(last.version + 1, end_ms, last.watermark_after, MAX_WATERMARK, 0, 0))
    return plan


def first_at_least(values: Sequence[int], threshold: int) -> int | None:
    """The first index whose (non-decreasing) value reaches ``threshold``, or None."""
    index = bisect.bisect_left(values, threshold)
    return index if index < len(values) else None


@dataclass(frozen=True)
class History:
    """Bronze's records (persisted: :meth:`release` them), the per-version summary the
    watermarks step through, and each candidate's steps (:func:`candidate_steps`)."""

    records: DataFrame
    summary: list
    steps: list[list[VersionClock]]

    @property
    def versions(self) -> list[int]:
        return sorted({row.version for row in self.summary})

    def release(self) -> None:
        self.records.unpersist()


def bronze_history(
    spark: SparkSession,
    registry: TableRegistry,
    candidates: Sequence[Candidate],
    flush: bool,
    columns: Sequence[str] = (),
) -> History:
    """Every bronze version's records (``columns`` beside what judging reads) and each
    candidate's watermark steps through them, as one silver pass over them all plans them."""
    config = registry.config
    latest = table_version(spark, registry.bronze.path)
    read = ["version", "source_partition", "ts_ms", "is_marker", "processing_time", *config.key, *columns]
    records = timed_records(read_bronze_history(spark, registry, latest), registry).select(*read).persist()
    try:
        try:
            summary = version_summary(records, any(c.watermark.needs_disorder for c in candidates))
        except PySparkException as error:
            first_line = str(error).strip().splitlines()[0]
            raise CannotTune(
                f"cannot read bronze.{config.name}'s change feed from its first version "
                f"(a vacuum or the log's retention may have removed it): {first_line}"
            ) from error
        if not summary:
            raise CannotTune(f"bronze.{config.name} holds no record to tune on")
        reports = source_reports(spark, registry, summary[0].version, latest)
        end_ms = max(row.processing_ms for row in summary)
        steps = [candidate_steps(c, summary, reports, flush, end_ms) for c in candidates]
    except BaseException:
        records.unpersist()
        raise
    return History(records, summary, steps)


def tune(
    spark: SparkSession, registry: TableRegistry, candidates: Sequence[Candidate], flush: bool
) -> Tuning:
    history = bronze_history(spark, registry, candidates, flush)
    try:
        windows, by_partition = judge(
            spark, history.records, registry, candidates, history.steps, history.summary
        )
        results = outcomes(candidates, windows, by_partition)
    finally:
        history.release()
    return Tuning(list(candidates), results, history.steps, windows)


def judge(
    spark: SparkSession,
    records: DataFrame,
    registry: TableRegistry,
    candidates: Sequence[Candidate],
    steps: list[list[VersionClock]],
    summary: Sequence,
) -> tuple[DataFrame, dict[str, list[int]]]:
    """Every pair judged against every candidate's watermark at its step's start:
    per partition the pairs and each candidate's late ones, and per (window, key)
    each candidate's first firing step, firing watermark, re-fire and delays."""
    config = registry.config
    versions = sorted({row.version for row in summary})
    at_step = local_rows(
        spark,
        [
            (version, step, [plan[step].watermark_before for plan in steps])
            for step, version in enumerate(versions)
        ],
        "version long, step int, before array<long>",
    )
    pairs = assign_windows(records.where(~F.col("is_marker")), config.window).join(
        F.broadcast(at_step), "version"
    )
    end = F.col("window_end_ms")
    late = [is_cleaned(end, F.col("before")[i], c.allowed_lateness_ms) for i, c in enumerate(candidates)]
    partitions = pairs.groupBy("source_partition").agg(
        F.count(F.lit(1)).alias("pairs"),
        *(F.sum(flag.cast("long")).alias(f"late_{i:d}") for i, flag in enumerate(late)),
    )
    by_partition = {
        row.source_partition: [row.pairs, *(row[f"late_{i:d}"] for i in range(len(candidates)))]
        for row in partitions.collect()
    }
    per_window = (
        pairs.groupBy(*config.key, "window_start_ms", "window_end_ms")
        .agg(
            *(F.min(F.when(~flag, F.col("step"))).alias(f"created_{i:d}") for i, flag in enumerate(late)),
            *(
                F.max(F.when(~flag & is_fired(end, F.col("before")[i]), F.col("step"))).alias(
                    f"refire_step_{i:d}"
                )
                for i, flag in enumerate(late)
            ),
        )
        .persist()
    )
    ends = sorted(row.window_end_ms for row in per_window.select("window_end_ms").distinct().collect())
    newest = running_newest(summary, versions)
    after = [[clock.watermark_after for clock in plan] for plan in steps]  # the flush step last, if any
    reach = local_rows(
        spark,
        [(e, first_at_least(newest, e), [first_at_least(marks, e - 1) for marks in after]) for e in ends],
        "window_end_ms long, reached int, passes array<int>",
    )
    # Every step's watermarks and newest event time as one row of arrays (a bronze table
    # of many versions would make literal arrays a plan of millions of expressions).
    lookup = local_rows(
        spark,
        [(newest, *after)],
        ", ".join(["newest array<long>", *(f"after_{i:d} array<long>" for i in range(len(after)))]),
    )
    firings = per_window.join(F.broadcast(reach), "window_end_ms").crossJoin(F.broadcast(lookup))
    for i in range(len(after)):
        created, fired = F.col(f"created_{i:d}"), F.col(f"fired_{i:d}")
        # A window fires at the first step that both holds it and passes its end.
        first = F.when(
            created.isNotNull() & F.col("passes")[i].isNotNull(), F.greatest(created, F.col("passes")[i])
        )
        before_end = fired < F.lit(len(versions))  # not fired by the end of input alone
        firings = (
            firings.withColumn(f"fired_{i:d}", first)
            .withColumn(f"watermark_{i:d}", element(F.col(f"after_{i:d}"), fired))
            # An on-time pair in a later step whose watermark had passed the window re-fires it.
            .withColumn(f"refired_{i:d}", F.coalesce(F.col(f"refire_step_{i:d}") > created, F.lit(False)))
            .withColumn(f"delay_event_{i:d}", F.when(before_end, element(F.col("newest"), fired) - end))
            # A watermark ahead of the data (markers, a custom generator) may fire a window
            # before the data reach its end: no delay in micro-batches then.
            .withColumn(
                f"delay_batches_{i:d}", F.when(before_end, F.greatest(F.lit(0), fired - F.col("reached")))
            )
        )
    return firings.drop("newest", *(f"after_{i:d}" for i in range(len(after)))), by_partition


def running_newest(summary: Sequence, versions: Sequence[int]) -> list[int]:
    """The newest event time the pipeline has seen after each version (non-decreasing;
    MIN_WATERMARK before its first data)."""
    newest, running = MIN_WATERMARK, []
    by_version: dict[int, list[int]] = {}
    for row in summary:
        if row.sent.max_timestamp is not None:
            by_version.setdefault(row.version, []).append(row.sent.max_timestamp)
    for version in versions:
        newest = max([newest, *by_version.get(version, [])])
        running.append(newest)
    return running


def element(values: Column, index: Column) -> Column:
    """``values[index]`` (0-based) of an array column; null for a null index."""
    return F.element_at(values, index + F.lit(1))


def outcomes(
    candidates: Sequence[Candidate], windows: DataFrame, by_partition: dict[str, list[int]]
) -> list[Outcome]:
    """Every candidate's figures, from one aggregation over the windows."""
    figures = []
    for i in range(len(candidates)):
        fired, delay_event = F.col(f"fired_{i:d}"), F.col(f"delay_event_{i:d}")
        figures += [
            F.count(F.col(f"created_{i:d}")).alias(f"windows_{i:d}"),
            F.count(delay_event).alias(f"fired_{i:d}"),
            F.sum(F.col(f"refired_{i:d}").cast("long")).alias(f"refired_{i:d}"),
            F.count(F.when(fired.isNotNull() & delay_event.isNull(), 1)).alias(f"at_end_{i:d}"),
            F.percentile(delay_event, list(QUANTILES)).alias(f"delay_event_{i:d}"),
            F.percentile(F.col(f"delay_batches_{i:d}"), list(QUANTILES)).alias(f"delay_batches_{i:d}"),
        ]
    row = windows.agg(*figures).first()
    pairs = sum(counts[0] for counts in by_partition.values())
    results = []
    for i, candidate in enumerate(candidates):
        late = {partition: counts[i + 1] for partition, counts in sorted(by_partition.items())}
        delay_event, delay_batches = row[f"delay_event_{i:d}"], row[f"delay_batches_{i:d}"]
        results.append(
            Outcome(
                candidate.label,
                pairs=pairs,
                quarantined=sum(late.values()),
                quarantined_by_partition={partition: n for partition, n in late.items() if n},
                windows=row[f"windows_{i:d}"],
                fired=row[f"fired_{i:d}"],
                refired=row[f"refired_{i:d}"] or 0,
                fired_at_end=row[f"at_end_{i:d}"],
                delay_event_ms=tuple(delay_event) if delay_event else None,
                delay_batches=tuple(delay_batches) if delay_batches else None,
            )
        )
    return results
