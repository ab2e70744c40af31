"""What-if over history for session windows (DESIGN §2b, §2c; ``tidemark tune`` on a
session pipeline): for candidate watermark settings and gaps, exactly what silver's
sessions would be over the same bronze versions, without a replay per candidate.

Every key's runs (:func:`~spark_jobs.engine.session_store.numbered`) reach Python once
per gap, where each candidate walks them through silver's own rules
(:func:`~spark_jobs.engine.session_store.judge_key`) from no sessions, through the
candidate's watermark steps, as one silver pass over the whole bronze table would.

Per candidate it reports the records quarantined (in total and per partition), the
sessions silver would hold, how many sessions of all the records at once silver would
hold in pieces (``split``: a record that would have joined them quarantined), how many
it would create and later merge into another (``merged``: a bridge arrived after
both existed), the firings and re-firings, and how long after a session's end it
first fired, in event time and in micro-batches, as for windows
(:mod:`~spark_jobs.engine.tuning`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.config import PipelineConfig
from spark_jobs.engine.session_store import (
    JOINED,
    LATE,
    SESSION,
    Limits,
    Step,
    Unit,
    judge_key,
    key_schema,
    numbered,
    per_key,
    proto_end,
    run_units,
    steps_of,
    verdicts,
)
from spark_jobs.engine.tuning import (
    QUANTILES,
    Candidate,
    CannotTune,
    Outcome,
    Tuning,
    bronze_history,
    first_at_least,
    running_newest,
)
from spark_jobs.eventtime.sessions import MERGED, SessionState
from spark_jobs.eventtime.windows import SessionSpec, Window, touches
from spark_jobs.tables import TableRegistry

# A tuning row of a session of all the records at once (what ``split`` counts).
WHOLE = "whole"


def tuned_schema(config: PipelineConfig) -> str:
    return (
        f"{key_schema(config)}, candidate int, kind string, version long, run long, member long,"
        " records long, status string, revision int, delay_event long, delay_batches long,"
        " fired_at_end boolean, pieces int"
    )


def whole_sessions(
    units: Sequence[Unit], max_duration_ms: int | None
) -> tuple[dict[tuple[int, int], int], int]:
    """A key's sessions of all its records at once, from its runs' spans: each run's
    (version, run) -> its session's number, and how many there are."""
    number_of: dict[tuple[int, int], int] = {}
    reach: Window | None = None
    count = 0
    for unit in sorted(units, key=lambda u: (u.start_ms, u.end_ms, u.version, u.run)):
        span = Window(unit.start_ms, unit.end_ms)
        if reach is None or not touches(span, reach, max_duration_ms):
            count, reach = count + 1, span
        else:
            reach = Window(reach.start, max(reach.end, span.end))
        number_of[(unit.version, unit.run)] = count - 1
    return number_of, count


def tune_key(
    key: tuple, units: Sequence[Unit], walks: Sequence[tuple[int, list[Step], Limits]], newest: Sequence[int]
) -> Iterator[dict]:
    """One key's runs walked by every candidate (``walks``: its index, steps and
    limits): a row per run or record it quarantines, per session it creates (with its
    first firing's delays), and per session of all the records at once (the sessions
    of the candidate's that hold its records: ``pieces``). ``newest``: the
    newest event time seen after each step before the end of input."""
    whole_of, wholes = whole_sessions(units, walks[0][2].max_duration_ms)
    for candidate, steps, limits in walks:
        first: dict[str, tuple[int, int]] = {}

        def fired(step: int, sessions: Sequence[SessionState], first: dict = first) -> None:
            for session in sessions:
                first.setdefault(session.session_id, (step, session.extent.end))

        holders: dict[int, set[str]] = {}
        for row in judge_key(key, (), units, steps, limits, fired):
            if row["kind"] == LATE:
                yield {
                    "candidate": candidate,
                    **{name: row[name] for name in ("kind", "version", "run", "member", "records")},
                }
            elif row["kind"] == JOINED:
                holders.setdefault(whole_of[(row["version"], row["run"])], set()).add(row["targets"][-1])
            else:
                yield {
                    "candidate": candidate,
                    "kind": SESSION,
                    "status": row["status"],
                    "revision": row["revision"],
                    **first_firing(first.get(row["session_id"]), newest),
                }
        for number in range(wholes):
            yield {"candidate": candidate, "kind": WHOLE, "pieces": len(holders.get(number, ()))}


def first_firing(firing: tuple[int, int] | None, newest: Sequence[int]) -> dict:
    """A session's first firing (its step and the session's end then) as delays: in
    event time (the newest event time seen at that step, less the end) and in steps
    from the first whose data reached the end; at the end of input, neither."""
    if firing is None:
        return {"fired_at_end": False}
    step, end = firing
    if step >= len(newest):
        return {"fired_at_end": True}
    reached = first_at_least(newest, end)
    return {
        "fired_at_end": False,
        "delay_event": newest[step] - end,
        # A watermark ahead of the data may fire a session before the data reach its end.
        "delay_batches": None if reached is None else max(0, step - reached),
    }


def tune_sessions(
    spark: SparkSession, registry: TableRegistry, candidates: Sequence[Candidate], flush: bool
) -> Tuning:
    """:mod:`~spark_jobs.engine.tuning`'s ``tune`` for a session pipeline: one pass
    over the keys per gap among the candidates."""
    config = registry.config
    spec: SessionSpec = config.window
    gap_column = [] if spec.gap_column is None else [spec.gap_column]
    history = bronze_history(spark, registry, candidates, flush, ["event_id", *gap_column])
    try:
        newest = running_newest(history.summary, history.versions)
        data_records = history.records.where(~F.col("is_marker"))
        records = data_records.count()
        if not records:
            raise CannotTune(f"bronze.{config.name} holds punctuation markers only, no record to tune on")
        no_sessions = spark.createDataFrame([], registry.silver.schema)
        tuned, judged = [], []
        for gap in dict.fromkeys(candidate.gap_ms for candidate in candidates):
            gapped = spec if gap is None else replace(spec, gap_ms=gap)
            data = numbered(data_records.withColumn("end_ms", proto_end(gapped)), config)
            walks = [
                (index, steps_of(plan), Limits(candidate.allowed_lateness_ms, spec.max_duration_ms))
                for index, (candidate, plan) in enumerate(zip(candidates, history.steps, strict=True))
                if candidate.gap_ms == gap
            ]

            def rule(
                key: tuple, _: Sequence[tuple], units: Sequence[Unit], walks: list = walks
            ) -> Iterator[dict]:
                return tune_key(key, units, walks, newest)

            runs = run_units(data, config, measures=False)
            rows = per_key(no_sessions, runs, config, rule, tuned_schema(config)).persist()
            tuned.append(rows)
            judged.append((data, rows))
        late_by_partition = quarantined_by_partition(judged, config)
        every = tuned[0]
        for rows in tuned[1:]:
            every = every.unionByName(rows)
        results = outcomes(candidates, every, late_by_partition, records)
    finally:
        history.release()
    return Tuning(list(candidates), results, history.steps, every)


def quarantined_by_partition(
    judged: Sequence[tuple[DataFrame, DataFrame]], config: PipelineConfig
) -> dict[int, dict[str, int]]:
    """Per candidate, the records it quarantines per source partition (``judged``: per
    gap, its numbered records and its tuning rows)."""
    key = list(config.key)
    found: dict[int, dict[str, int]] = {}
    for data, rows in judged:
        whole, split = verdicts(rows.where(F.col("kind") == LATE), config, "candidate")
        late = data.join(whole, [*key, "version", "run"]).unionByName(
            data.join(split, [*key, "version", "member"])
        )
        for row in late.groupBy("candidate", "source_partition").count().collect():
            found.setdefault(row.candidate, {})[row.source_partition] = row["count"]
    return found


def outcomes(
    candidates: Sequence[Candidate], rows: DataFrame, by_partition: dict[int, dict[str, int]], records: int
) -> list[Outcome]:
    """Every candidate's figures, from one aggregation over the tuning rows."""
    kind, status, delay_event = F.col("kind"), F.col("status"), F.col("delay_event")
    figures = {
        row.candidate: row
        for row in rows.groupBy("candidate")
        .agg(
            F.coalesce(F.sum(F.when(kind == LATE, F.col("records"))), F.lit(0)).alias("quarantined"),
            F.count(F.when((kind == SESSION) & (status != MERGED), 1)).alias("sessions"),
            F.count(F.when(status == MERGED, 1)).alias("merged"),
            F.count(F.when((kind == WHOLE) & (F.col("pieces") > 1), 1)).alias("split"),
            F.count(delay_event).alias("fired"),
            F.count(F.when(F.col("revision") >= 2, 1)).alias("refired"),
            F.count(F.when(F.col("fired_at_end"), 1)).alias("at_end"),
            F.percentile(delay_event, list(QUANTILES)).alias("delay_event"),
            F.percentile(F.col("delay_batches"), list(QUANTILES)).alias("delay_batches"),
        )
        .collect()
    }
    results = []
    for index, candidate in enumerate(candidates):
        row = figures[index]
        late = dict(sorted(by_partition.get(index, {}).items()))
        results.append(
            Outcome(
                candidate.label,
                pairs=records,
                quarantined=row.quarantined,
                quarantined_by_partition=late,
                windows=row.sessions,
                fired=row.fired,
                refired=row.refired,
                fired_at_end=row.at_end,
                delay_event_ms=tuple(row.delay_event) if row.delay_event else None,
                delay_batches=tuple(row.delay_batches) if row.delay_batches else None,
                split=row.split,
                merged=row.merged,
            )
        )
    return results
