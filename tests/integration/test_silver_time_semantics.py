"""Silver on real Spark and Delta beyond bounded event time: punctuated markers,
and windows on ingestion or processing time, each checked against the model."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from spark_jobs.eventtime import Batch, Record, run_reference
from tests.integration.engine import (
    BASE_MS,
    assert_reconciles,
    engine_config,
    engine_history,
    engine_quarantine,
    engine_windows,
    model_history,
    model_of,
    model_quarantine,
    model_windows,
    payload,
    replay_batches,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

MINUTE = 60_000


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("silver-time")


def marker(partition: int, watermark_ms: int) -> dict:
    """A punctuated marker: no key, no measures, only the watermark it carries."""
    return {"partition": partition, "ts": watermark_ms, "marker": "wm"}


def test_punctuated_markers_drive_the_watermark_and_are_not_counted_as_data(spark, root):
    config = engine_config(
        {"type": "tumbling", "size": "1m", "offset": "0s"},
        {"strategy": "punctuated", "marker_column": "marker"},
    )
    batches = [
        # Data far past the first window moves nothing: only markers do.
        [payload(0, BASE_MS + 10_000, "d1", 50.0, 1.0), payload(1, BASE_MS + 5 * MINUTE, "d1", 40.0, 2.0)],
        [marker(0, BASE_MS + 65_000), payload(1, BASE_MS + 20_000, "d1", 30.0, 3.0)],
        [marker(1, BASE_MS + 70_000), payload(0, BASE_MS + 40_000, "d1", 20.0, 4.0)],
        [payload(0, BASE_MS + 50_000, "d1", 10.0, 5.0)],  # after both markers passed 1m: late
    ]
    registry = replay_batches(spark, config, root, batches)
    model = model_of(config, batches)

    windows = engine_windows(spark, registry)
    assert windows == model_windows(config, model)
    assert engine_quarantine(spark, registry) == model_quarantine(model)
    assert engine_history(spark, registry) == model_history(model)
    first = (("r1", "d1"), (BASE_MS, BASE_MS + MINUTE))
    later = (("r1", "d1"), (BASE_MS + 5 * MINUTE, BASE_MS + 6 * MINUTE))
    assert windows[first][0] == 3 and windows[first][2] == 1  # fired once both markers passed it
    assert windows[later][0] == 1 and windows[later][2] == 0  # no marker reached it
    assert len(windows) == 2  # the markers (at 1m05s, 1m10s) opened no window
    # Only markers move the watermark: the slowest partition's marker is the minimum.
    assert [entry[0] for entry in engine_history(spark, registry)][2:] == [BASE_MS + 65_000] * 2
    assert sum(engine_quarantine(spark, registry).values()) == 1
    assert_reconciles(spark, registry, [r for batch in batches for r in batch])


@pytest.mark.parametrize(
    ("characteristic", "column"), [("ingestion", "ingest_time"), ("processing", "processing_time")]
)
def test_windows_can_run_on_ingestion_or_processing_time(spark, root, characteristic, column):
    """Event times shuffled far beyond the bound: on event time most of them would be
    late; on arrival time (the file's landing, or the bronze batch's clock) none is."""
    config = engine_config(
        {"type": "tumbling", "size": "20ms", "offset": "0s"},
        {"strategy": "bounded", "max_out_of_orderness": "0s"},
        time_characteristic=characteristic,
    )
    shuffled = random.Random(5).sample(range(40), 40)
    records = [
        payload(i % 2, BASE_MS + minute * MINUTE, f"d{i % 3}", 50.0, 1.0) for i, minute in enumerate(shuffled)
    ]
    batches = [records[start : start + 5] for start in range(0, len(records), 5)]
    on_event_time = run_reference(
        config.rules(),
        [Batch([Record(str(r["partition"]), r["ts"], r) for r in batch]) for batch in batches],
    )
    assert len(on_event_time.quarantined) > 10  # the input really is disordered in event time

    registry = replay_batches(spark, config, root, batches)

    arrival = {
        (row.device_id, row.ts): row.arrival_ms
        for row in spark.read.format("delta")
        .load(registry.bronze.path)
        .selectExpr("device_id", "ts", f"unix_millis({column}) AS arrival_ms")
        .collect()
    }
    timed = [[{**r, "arrival_ms": arrival[(r["device_id"], r["ts"])]} for r in batch] for batch in batches]
    assert len({r["arrival_ms"] for r in timed[0] + timed[-1]}) == 2  # one arrival time per batch
    model = model_of(config, timed, column="arrival_ms")
    assert engine_windows(spark, registry) == model_windows(config, model)
    assert engine_history(spark, registry) == model_history(model)
    assert not engine_quarantine(spark, registry)
    assert_reconciles(spark, registry, [r for batch in timed for r in batch], column="arrival_ms")
