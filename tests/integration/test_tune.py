"""``tidemark tune`` against real replays: on generated telemetry with late uploads and
a partition that goes quiet, for each candidate (bounds, a bound with more lateness,
the adaptive generator) the pairs it says silver would quarantine, per partition, and
the watermark at which each window first fires, equal what a real ``tidemark replay``
with that candidate writes; and the command's own output."""

from __future__ import annotations

import json
from collections import Counter
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

import pytest
from tidemark_airflow.lakehouse import latest_tuning

from spark_jobs.config import load_pipeline
from spark_jobs.engine.tuning import parse_candidate, tune
from spark_jobs.eventtime.clock import MAX_WATERMARK
from spark_jobs.generator import FleetSpec, generate
from spark_jobs.jobs import tune as tune_job
from spark_jobs.jobs.backfill import cut_batches, ingest_batches
from spark_jobs.jobs.replay import replay
from spark_jobs.lakehouse.files import delete_tree
from tests.integration.conftest import registry_for, write_pipeline

pytestmark = [pytest.mark.spark, pytest.mark.slow]

FLEET = FleetSpec(
    devices=6,
    partitions=3,
    seed=23,
    duration_ms=20 * 60_000,
    late_ratio=0.05,
    late_delay_ms=(30_000, 150_000),
    offline_ratio=0.0,
    quiet_partitions=1,
    quiet_after=0.6,
)
BATCH_SIZE = 40
# Idle after a millisecond: a partition with nothing left to send goes idle at the next
# micro-batch in a replay and in tune alike (their bronze batches are far more apart).
IDLENESS = "1ms"
# (tune's candidate, the same as a pipeline file's watermark section and allowed lateness)
CANDIDATES = [
    ("2s", {"strategy": "bounded", "max_out_of_orderness": "2s"}, "30s"),
    ("5s+2m", {"strategy": "bounded", "max_out_of_orderness": "5s"}, "2m"),
    (
        "spark_jobs.eventtime.adaptive:AdaptiveBound(floor=1s, ceiling=20s)",
        {
            "strategy": "custom",
            "generator": "spark_jobs.eventtime.adaptive:AdaptiveBound",
            "options": {"floor": "1s", "ceiling": "20s"},
        },
        "30s",
    ),
]
MINUTE = 60_000


def written_history(tmp_path_factory) -> tuple[Path, Path]:
    """A folder, and the generated fleet's history as an input file in it."""
    folder = tmp_path_factory.mktemp("tune")
    source = folder / "history.json"
    source.write_text("".join(record.line + "\n" for record in generate(FLEET)))
    return folder, source


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    return written_history(tmp_path_factory)


def pipeline_with(folder, watermark: dict, lateness: str, name: str, **sections):
    return write_pipeline(
        folder,
        pipeline=name,
        watermark={**watermark, "idleness": IDLENESS},
        allowed_lateness=lateness,
        **sections,
    )


def replayed(spark, pipeline: Path, source: Path, lakehouse: Path):
    """A real replay of ``source`` under ``pipeline``: its tables and its quarantine."""
    assert replay(spark, load_pipeline(pipeline), source, str(lakehouse), BATCH_SIZE, flush=True) == 0
    registry = registry_for(pipeline, lakehouse)
    return registry, spark.read.format("delta").load(registry.quarantine.path)


def quarantined_by_partition(quarantine) -> dict[str, int]:
    return dict(Counter(row.source_partition for row in quarantine.select("source_partition").collect()))


def replay_firings(spark, registry) -> dict[tuple, int]:
    """From a replay's own tables, the watermark at which each silver window (device,
    region, start) first fired: the first watermark step, from the micro-batch of the
    window's first on-time record on, that passed the window's end (1-minute windows)."""
    bronze = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0)
    inserts = bronze.load(registry.bronze.path).where("_change_type = 'insert'")
    late_ids = {
        row.event_id
        for row in spark.read.format("delta").load(registry.quarantine.path).select("event_id").collect()
    }
    created: dict[tuple, int] = {}
    for row in inserts.selectExpr(
        "event_id", "device_id", "region", "unix_millis(event_time) AS ts", "_commit_version"
    ).collect():
        if row.event_id in late_ids:
            continue
        window = (row.region, row.device_id, row.ts - row.ts % MINUTE)
        created[window] = min(created.get(window, row._commit_version), row._commit_version)
    steps = sorted(
        (row.batch_id, row.watermark)
        for row in spark.read.format("delta")
        .load(registry.ops["watermark_history"].path)
        .where(f"pipeline = '{registry.config.name}'")
        .collect()
    )
    firings = {}
    for window, version in created.items():
        end = window[2] + MINUTE
        firings[window] = next((w for batch, w in steps if batch >= version and w >= end - 1), None)
    return firings


def test_tune_says_exactly_what_a_replay_of_each_candidate_writes(spark, history, tmp_path):
    folder, source = history
    base = pipeline_with(folder, CANDIDATES[0][1], CANDIDATES[0][2], "tuned")
    config = load_pipeline(base)
    candidates = [parse_candidate(label, config) for label, _, _ in CANDIDATES]
    batches = list(cut_batches(config, source, BATCH_SIZE, None))
    assert ingest_batches(spark, config, batches, str(tmp_path / "scratch")) == 0
    tuning = tune(spark, registry_for(base, tmp_path / "scratch"), candidates, flush=True)
    windows = tuning.windows.collect()

    for index, (label, watermark, lateness) in enumerate(CANDIDATES):
        outcome = tuning.outcomes[index]
        pipeline = pipeline_with(tmp_path, watermark, lateness, f"replayed_{index}")
        registry, quarantine = replayed(spark, pipeline, source, tmp_path / "lakehouse")
        assert outcome.quarantined_by_partition == quarantined_by_partition(quarantine), label
        silver = spark.read.format("delta").load(registry.silver.path)
        on_time = silver.selectExpr("coalesce(sum(record_count), 0)").first()[0]
        # Nothing lost, nothing doubled: every generated record is one pair (tumbling windows,
        # nothing malformed), on time in silver or quarantined.
        assert on_time + quarantine.count() == outcome.pairs == len(generate(FLEET)), label

        tuned = {
            (row.region, row.device_id, row.window_start_ms): row[f"watermark_{index}"]
            for row in windows
            if row[f"created_{index}"] is not None
        }
        assert tuned == replay_firings(spark, registry), label
        refired = {
            (row.region, row.device_id, row.window_start_ms) for row in windows if row[f"refired_{index}"]
        }
        replayed_refired = {
            (row.region, row.device_id, row.start)
            for row in silver.where("revision >= 2")
            .selectExpr("region", "device_id", "unix_millis(window_start) AS start")
            .collect()
        }
        assert refired == replayed_refired, label
        assert outcome.windows == silver.count() and outcome.refired == len(refired), label

    # The data means what the test says: late pairs and re-fires for the tight bound,
    # none late with two minutes of lateness, and the quiet partition idle at the end.
    tight, loose, _ = tuning.outcomes
    assert tight.quarantined > loose.quarantined == 0
    assert tight.refired > 0
    last_step = tuning.steps[0][-2]  # before the end of input
    assert last_step.idle_partitions == 1 and last_step.watermark_after != MAX_WATERMARK


def test_the_command_prints_its_table_or_json_and_draws_the_chart(spark, history, tmp_path, monkeypatch):
    folder, source = history
    pipeline = pipeline_with(folder, CANDIDATES[0][1], CANDIDATES[0][2], "commanded")
    chart, lakehouse = tmp_path / "tradeoff.svg", tmp_path / "lakehouse"
    scratches = []

    def delete_scratch(spark, scratch: str) -> None:
        scratches.append((Path(scratch).parent, Path(scratch, "bronze").is_dir()))
        delete_tree(spark, scratch)

    monkeypatch.setattr(tune_job, "delete_tree", delete_scratch)
    output = StringIO()
    with redirect_stdout(output):
        code = tune_job.main(
            [
                *("--pipeline", str(pipeline), "--input", str(source), "--batch-size", str(BATCH_SIZE)),
                *("--candidates", "2s", "30s", "--json", "--chart", str(chart)),
                *("--save", "--lakehouse", str(lakehouse)),
            ]
        )
    assert code == 0
    # The input's scratch lakehouse was under the lakehouse root, which a cluster's
    # executors reach (the driver's temporary folder they do not), and is gone.
    assert scratches == [(lakehouse / "_scratch", True)]
    assert list((lakehouse / "_scratch").iterdir()) == []
    figures = {entry["candidate"]: entry for entry in json.loads(output.getvalue())}
    # Saved for the Watermarks page, which reads it without Spark.
    saved = {row["candidate"]: row for row in latest_tuning(str(lakehouse), "commanded")}
    assert {c: (r["late_pairs"], r["delay_event_p50_ms"]) for c, r in saved.items()} == {
        c: (f["late_pairs"], f["delay_event_p50_ms"]) for c, f in figures.items()
    }
    assert {row["history"] for row in saved.values()} == {f"input {source}"}
    assert set(figures) == {"2s", "30s"}
    # A looser bound loses fewer pairs and fires later.
    assert figures["30s"]["late_pairs"] < figures["2s"]["late_pairs"]
    assert figures["30s"]["delay_event_p50_ms"] > figures["2s"]["delay_event_p50_ms"]
    svg = chart.read_text()
    assert svg.startswith("<svg") and svg.count("<circle") == 2 and ">30s</text>" in svg
