"""Custom watermark generators in the Spark engine: the per-batch summary Spark
computes equals the model's, the engine equals the model with custom generators,
and a generator written beside a pipeline file plugs in through the YAML of a real
``tidemark replay``."""

from __future__ import annotations

import json
from collections import defaultdict
from contextlib import redirect_stderr, redirect_stdout
from io import StringIO

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_jobs.config import load_pipeline
from spark_jobs.engine.judging import version_summary
from spark_jobs.eventtime.model import Record, summarize
from spark_jobs.jobs import replay
from spark_jobs.tables import TableRegistry
from tests.integration.engine import (
    BASE_MS,
    assert_engine_equals_model,
    assert_reconciles,
    engine_config,
    engine_document,
    engine_history,
    engine_quarantine,
    model_history,
    model_of,
    model_quarantine,
    payload,
    replay_batches,
)
from tests.integration.test_silver_matches_model import TUMBLING_10S, batched

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(st.integers(1, 2), st.sampled_from("ab"), st.integers(-5_000, 5_000), st.booleans()),
        min_size=1,
        max_size=40,
    )
)
def test_the_batch_summary_spark_computes_equals_the_models(spark, rows):
    frame = spark.createDataFrame(
        [(version, partition, ts, marker, 1_000) for version, partition, ts, marker in rows],
        "version long, source_partition string, ts_ms long, is_marker boolean, processing_ms long",
    ).selectExpr("*", "timestamp_millis(processing_ms) AS processing_time")
    by_version = defaultdict(list)
    for version, partition, ts, marker in rows:
        by_version[version].append(Record(partition, ts, marker=marker))
    expected = {
        (version, partition): sent
        for version, records in by_version.items()
        for partition, sent in summarize(records).items()
    }
    engine = {
        (row.version, row.source_partition): row.sent for row in version_summary(frame, with_disorder=True)
    }
    assert engine == expected


GENERATORS = [
    {"generator": "spark_jobs.eventtime.adaptive:AdaptiveBound", "options": {"floor": "0s", "ceiling": "6s"}},
    {"generator": "tests.unit.user_generators:MedianDisorder"},
    {"generator": "tests.unit.user_generators:ShrinkingBound", "options": {"start": 8_000, "step": 3_000}},
]


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    batches=batched(),
    generator=st.sampled_from(GENERATORS),
    idleness=st.sampled_from([None, "1ms"]),
    silver_every_batch=st.booleans(),
    flush=st.booleans(),
)
def test_silver_with_a_custom_generator_equals_the_reference_model(
    spark, tmp_path_factory, batches, generator, idleness, silver_every_batch, flush
):
    root = tmp_path_factory.getbasetemp() / "custom-vs-model"
    root.mkdir(exist_ok=True)
    config = engine_config(TUMBLING_10S, {"strategy": "custom", **generator, "idleness": idleness}, "3s")
    registry = replay_batches(
        spark, config, root, batches, flush=flush, silver_every_batch=silver_every_batch
    )
    assert_engine_equals_model(spark, config, registry, batches, flush)


# A generator a user keeps beside the pipeline file: the watermark trails the
# partition's newest event time by a bound that grows by 5 s with every batch the
# partition sends (state that must carry from batch to batch).
WIDENING = """
class Widening:
    def __init__(self, step_ms):
        self.step_ms, self.bound = step_ms, 0

    def on_batch(self, batch):
        self.bound += self.step_ms
        newest = max(t for t in (batch.running_max, batch.max_timestamp) if t is not None)
        return newest - self.bound - 1

    def snapshot(self):
        return {"bound": self.bound}

    def restore(self, state):
        self.bound = state["bound"]
"""


def test_a_generator_beside_the_pipeline_file_drives_a_replay_as_it_drives_the_model(spark, tmp_path):
    (tmp_path / "widening_watermarks.py").write_text(WIDENING)
    document = engine_document(
        TUMBLING_10S,
        {"strategy": "custom", "generator": "widening_watermarks:Widening", "options": {"step_ms": 5_000}},
    )
    pipeline = tmp_path / f"{document['pipeline']}.yaml"
    pipeline.write_text(yaml.safe_dump(document))
    # One partition: the bound widens 5 s a batch, so stragglers as far behind as the
    # last bound (not the first) are on time. Seconds after BASE_MS:
    stream = [(100,), (120, 88), (140, 101), (160, 121)]
    batches = [[payload(0, BASE_MS + s * 1_000, "d1", 1.0, 1.0) for s in step] for step in stream]
    source = tmp_path / "input.json"
    source.write_text(
        "".join(json.dumps({**r, "batch": i}) + "\n" for i, batch in enumerate(batches) for r in batch)
    )
    lakehouse = tmp_path / "lakehouse"
    output = StringIO()
    with redirect_stdout(output), redirect_stderr(output):
        code = replay.main(
            [
                "--pipeline",
                str(pipeline),
                "--input",
                str(source),
                "--lakehouse",
                str(lakehouse),
                "--batch-column",
                "batch",
            ]
        )
    assert code == 0, output.getvalue()

    config = load_pipeline(pipeline)
    registry = TableRegistry(config, str(lakehouse))
    expected = model_of(config, batches)
    assert engine_history(spark, registry) == model_history(expected)
    assert engine_quarantine(spark, registry) == model_quarantine(expected)
    # Bounds of 5, 10, 15, 20 s after the batches: watermarks 95, 110, 125, 140 s (less 1 ms).
    # 88 s (window [80, 90) against 95 s) and 101 s ([100, 110) against 110 s) are late;
    # 121 s ([120, 130) against 125 s) is on time, as it would not be under a bound of 5 s.
    assert [row[0] - BASE_MS for row in engine_history(spark, registry)] == [
        94_999,
        109_999,
        124_999,
        139_999,
    ]
    assert sorted(row[1] - BASE_MS for row in engine_quarantine(spark, registry)) == [88_000, 101_000]
    assert_reconciles(spark, registry, [record for batch in batches for record in batch])
