"""``tidemark tune`` on a session pipeline against real replays: on the same generated
telemetry as ``test_tune``, for each candidate (a tight bound, more lateness, a wider
gap) the records it says silver would quarantine, per partition, the sessions it would
hold, split, merge and re-fire equal what a real replay with that candidate writes;
and the command's own output with ``--gaps``."""

from __future__ import annotations

import json
from contextlib import redirect_stdout
from dataclasses import replace
from io import StringIO

import pytest
from pyspark.sql.types import StructType

from spark_jobs.config import load_pipeline, parse_duration
from spark_jobs.engine.session_tuning import tune_sessions
from spark_jobs.engine.tuning import parse_candidate
from spark_jobs.eventtime.sessions import MERGED
from spark_jobs.generator import generate
from spark_jobs.jobs import tune as tune_job
from spark_jobs.jobs.backfill import cut_batches, ingest_batches
from spark_jobs.tables import tuning_table
from tests.integration.conftest import registry_for
from tests.integration.test_tune import (
    BATCH_SIZE,
    CANDIDATES,
    FLEET,
    pipeline_with,
    quarantined_by_partition,
    replayed,
    written_history,
)
from tests.unit.test_session_model import naive_sessions

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    return written_history(tmp_path_factory)


def sessions_split(spark, registry) -> int:
    """How many sessions of all bronze's records at once (the naive rule) silver holds
    in more than one session."""
    gap = registry.config.window.gap_ms
    records: dict[tuple, list] = {}
    for row in (
        spark.read.format("delta")
        .load(registry.bronze.path)
        .selectExpr("region", "device_id", "unix_millis(event_time) AS ts")
        .collect()
    ):
        records.setdefault((row.region, row.device_id), []).append((row.ts, row.ts + gap))
    held = (
        spark.read.format("delta")
        .load(registry.silver.path)
        .where(f"status != '{MERGED}'")
        .selectExpr(
            "region", "device_id", "unix_millis(session_start) AS start", "unix_millis(session_end) AS end"
        )
        .collect()
    )
    split = 0
    for key, intervals in records.items():
        for start, end, _ in naive_sessions(intervals):
            pieces = [s for s in held if (s.region, s.device_id) == key and start <= s.start and s.end <= end]
            split += len(pieces) > 1
    return split


# (candidate, the pipeline file's watermark, allowed lateness and session gap)
SESSION_CANDIDATES = [
    ("2s", {"strategy": "bounded", "max_out_of_orderness": "2s"}, "30s", None),
    ("5s+2m", {"strategy": "bounded", "max_out_of_orderness": "5s"}, "2m", None),
    ("2s", {"strategy": "bounded", "max_out_of_orderness": "2s"}, "30s", "40s"),
]
GAP = "15s"


def test_tune_says_exactly_what_a_replay_of_each_candidate_makes_of_sessions(spark, history, tmp_path):
    folder, source = history
    first = SESSION_CANDIDATES[0]
    base = pipeline_with(folder, first[1], first[2], "tuned_sessions", window={"type": "session", "gap": GAP})
    config = load_pipeline(base)
    candidates = [
        replace(parse_candidate(label, config), gap_ms=gap and parse_duration(gap, "gap"))
        for label, _, _, gap in SESSION_CANDIDATES
    ]
    batches = list(cut_batches(config, source, BATCH_SIZE, None))
    assert ingest_batches(spark, config, batches, str(tmp_path / "scratch")) == 0
    tuning = tune_sessions(spark, registry_for(base, tmp_path / "scratch"), candidates, flush=True)

    for index, (label, watermark, lateness, gap) in enumerate(SESSION_CANDIDATES):
        outcome = tuning.outcomes[index]
        window = {"type": "session", "gap": gap or GAP}
        pipeline = pipeline_with(tmp_path, watermark, lateness, f"replayed_sessions_{index}", window=window)
        registry, quarantine = replayed(spark, pipeline, source, tmp_path / "lakehouse")
        assert outcome.quarantined_by_partition == quarantined_by_partition(quarantine), label
        silver = spark.read.format("delta").load(registry.silver.path)
        held = silver.where(f"status != '{MERGED}'")
        on_time = held.selectExpr("coalesce(sum(record_count), 0)").first()[0]
        # Nothing lost, nothing doubled: every generated record is in one session or quarantined.
        assert on_time + quarantine.count() == outcome.pairs == len(generate(FLEET)), label
        assert outcome.quarantined == quarantine.count(), label
        assert outcome.windows == held.count(), label
        assert outcome.merged == silver.where(f"status = '{MERGED}'").count(), label
        assert outcome.refired == silver.where("revision >= 2").count(), label
        assert outcome.fired + outcome.fired_at_end == silver.where("revision >= 1").count(), label
        assert outcome.split == sessions_split(spark, registry), label

    # The data means what the test says: the tight bound quarantines late records and
    # so splits sessions they would have bridged; two minutes of lateness lets most of
    # them bridge, merging sessions; a wider gap makes fewer sessions.
    tight, loose, wider = tuning.outcomes
    assert tight.quarantined > loose.quarantined and tight.split > loose.split
    assert loose.merged > tight.merged
    assert wider.windows < tight.windows


def test_the_command_tunes_session_gaps_and_saves_beside_an_older_tuning_table(spark, history, tmp_path):
    folder, source = history
    window = {"type": "session", "gap": GAP}
    pipeline = pipeline_with(folder, CANDIDATES[0][1], CANDIDATES[0][2], "commanded_sessions", window=window)
    lakehouse = tmp_path / "lakehouse"
    # ops.tuning as a Tidemark without the session figures made it.
    tuning = tuning_table(str(lakehouse))
    older = StructType([f for f in tuning.schema.fields if f.name not in ("split", "merged")])
    spark.createDataFrame([], older).write.format("delta").partitionBy("pipeline").save(tuning.path)
    output = StringIO()
    with redirect_stdout(output):
        code = tune_job.main(
            [
                *("--pipeline", str(pipeline), "--input", str(source), "--batch-size", str(BATCH_SIZE)),
                *("--candidates", "2s", "5s+2m", "--gaps", GAP, "40s", "--json"),
                *("--save", "--lakehouse", str(lakehouse)),
            ]
        )
    assert code == 0
    figures = {entry["candidate"]: entry for entry in json.loads(output.getvalue())}
    assert list(figures) == ["2s gap 15s", "2s gap 40s", "5s+2m gap 15s", "5s+2m gap 40s"]
    saved = {
        row.candidate: (row.late_pairs, row.windows, row.split, row.merged)
        for row in spark.read.format("delta").load(tuning.path).collect()
    }
    assert saved == {c: (f["late_pairs"], f["windows"], f["split"], f["merged"]) for c, f in figures.items()}
    # A wider gap makes fewer sessions; more lateness quarantines fewer records.
    assert figures["2s gap 40s"]["windows"] < figures["2s gap 15s"]["windows"]
    assert figures["5s+2m gap 15s"]["late_pairs"] < figures["2s gap 15s"]["late_pairs"]
