"""Silver killed with SIGKILL mid-stream while bronze keeps ingesting, then
restarted: silver equals a batch computation over all of the input, with no pair
lost or counted twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_jobs.generator import FleetSpec, generate, write_landing
from tests.integration.conftest import (
    job_running,
    kill_hard,
    registry_for,
    run_here,
    wait_for,
    write_pipeline,
)
from tests.integration.engine import (
    assert_reconciles,
    engine_windows,
    model_of,
    model_windows,
    rounded,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def committed_batches(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return len([p for p in commits.iterdir() if p.name.isdigit()]) if commits.exists() else 0


def test_kill_9_silver_mid_stream_then_restart_gives_the_uninterrupted_answer(spark, tmp_path):
    landing, lakehouse = tmp_path / "landing", tmp_path / "lakehouse"
    pipeline = write_pipeline(
        tmp_path,
        source={"kind": "files", "path": str(landing), "format": "json", "max_files_per_trigger": 1},
        # No idleness: a partition must not be skipped because the test machine is slow.
        watermark={"strategy": "bounded", "max_out_of_orderness": "5s"},
    )
    registry = registry_for(pipeline, lakehouse)
    fleet = generate(
        FleetSpec(devices=6, partitions=3, seed=11, duration_ms=600_000, bound_ms=5_000, offline_ratio=0.0)
    )
    records = [g.payload for g in fleet]
    write_landing(fleet, landing, 10)
    silver_checkpoint = lakehouse / "_checkpoints" / registry.config.name / "silver"
    history = registry.ops["watermark_history"].path

    continuous = ("--trigger", "continuous", "--interval", "300ms")
    with (
        job_running("bronze", pipeline, lakehouse, *continuous),
        job_running("silver", pipeline, lakehouse, *continuous) as silver,
    ):
        wait_for(lambda: committed_batches(silver_checkpoint) >= 3, 300, "silver to commit a few batches")
        kill_hard(silver)
    batches_before_kill = spark.read.format("delta").load(history).count()

    # The restart (the pipeline's application, in this process) drains the rest of the
    # landing zone in one trigger and flushes.
    unlimited = write_pipeline(
        tmp_path,
        source={"kind": "files", "path": str(landing), "format": "json"},
        watermark={"strategy": "bounded", "max_out_of_orderness": "5s"},
    )
    assert run_here("run", unlimited, lakehouse, "--trigger", "available-now", "--flush").returncode == 0

    # Each partition is within its 5 s bound, so however the batches fell, nothing is
    # late: silver must equal one batch over everything, flushed.
    expected = model_of(registry.config, [records], flush=True)
    assert not expected.quarantined
    actual = rounded(engine_windows(spark, registry))
    assert actual == rounded(model_windows(registry.config, expected))
    assert {status for _, _, _, status in actual.values()} == {"closed"}
    batch_ids = [
        row.batch_id for row in spark.read.format("delta").load(history).orderBy("batch_id").collect()
    ]
    # No batch recorded twice or skipped (the first trigger saw an empty bronze: no row).
    assert batch_ids == list(range(batch_ids[0], batch_ids[0] + len(batch_ids)))
    assert 0 < batches_before_kill < len(batch_ids) - 1, "the kill should land mid-stream"
    assert_reconciles(spark, registry, records)
