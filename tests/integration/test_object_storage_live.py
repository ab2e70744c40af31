"""A live pipeline on object storage (SeaweedFS on loopback), from files landed on the
store: its application is killed with SIGKILL mid-work and restarted, a late merge
runs beside its streams, the idleness check fires the windows a quiet input leaves
open, and afterwards the tables reconcile exactly and equal a batch computation over
bronze, with nothing of the lakehouse on this machine's disk. From Kafka, on a
cluster under Airflow, the same is in test_production_rehearsal.py."""

from __future__ import annotations

import random
import re
import time
import uuid
from pathlib import Path

import pytest

from spark_jobs.engine import late_merge
from spark_jobs.generator import (
    FleetSpec,
    Manifest,
    generate,
    malformed_kinds,
    write_landing,
)
from spark_jobs.jobs import check_idle, gold
from spark_jobs.jobs.common import JobContext
from spark_jobs.tables import join
from tests.integration.conftest import (
    assert_bronze_reconciles,
    job_running,
    registry_for,
    run_here,
    wait_for,
    write_pipeline,
)
from tests.integration.lakehouse_sql import (
    batch_gold,
    batch_silver,
    batch_status_events,
    engine_gold,
    engine_silver,
    engine_status_events,
)
from tests.integration.test_fault_injection import kill_after_progress
from tests.integration.test_idleness_check import history
from tests.integration.test_late_merge import (
    assert_reconciles,
    end_the_input,
    quarantine_by_status,
    silver_caught_up,
    stop_gracefully,
    table_rows,
)
from tests.integration.test_object_storage import objects_under

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(1200)]
CONTINUOUS = ("--trigger", "continuous", "--interval", "1s")
PARTITIONS = 3
IDLENESS_S = 3
FLEET = FleetSpec(
    devices=6,
    partitions=PARTITIONS,
    seed=77,
    duration_ms=30 * 60_000,
    late_ratio=0.08,
    late_delay_ms=(90_000, 300_000),
    malformed_ratio=0.02,
)


def test_a_live_pipeline_on_object_storage_survives_a_kill_merges_beside_its_streams_and_idles(
    spark, s3_server, tmp_path, monkeypatch
):
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    root = f"s3a://{s3_server.bucket}/live-{uuid.uuid4().hex}"
    source = {"kind": "files", "path": f"{root}/landing", "format": "json", "max_files_per_trigger": 2}
    watermark = {"strategy": "bounded", "max_out_of_orderness": "5s", "idleness": f"{IDLENESS_S}s"}
    pipeline = write_pipeline(tmp_path, source=source, watermark=watermark)
    lakehouse = f"{root}/lake"
    registry = registry_for(pipeline, lakehouse)
    fleet = generate(FLEET, malformed_kinds("files"))
    half = len(fleet) // 2

    def feed(records) -> None:
        write_landing(records, source["path"], 20, prefix=f"part-{len(records)}")

    feed(fleet[:half])
    # SIGKILL once the application has committed a few writes, bronze's and silver's.
    writes = kill_after_progress(
        "run", CONTINUOUS, pipeline, lakehouse, tmp_path / "run.trace", (6, 10), random.Random("files")
    )
    assert writes is not None and {"bronze", "silver"} <= {write.split(":")[0] for write in writes}

    with job_running("run", pipeline, lakehouse, *CONTINUOUS) as streams:
        feed(fleet[half:])
        wait_for(lambda: table_rows(spark, registry.quarantine.path) > 0, 300, "a quarantined record", 2)
        # Beside the restarted streams (in this process: on object storage a merge runs
        # in an application of its own).
        merged = run_here("merge_late", pipeline, lakehouse, streaming=False)
        assert merged.returncode == 0, merged.stdout[-3000:]
        assert int(re.search(r"merged (\d+) late records", merged.stdout).group(1)) > 0
        assert streams.poll() is None, "the streams died while the merge ran"
        wait_for(
            lambda: (
                table_rows(spark, registry.bronze.path) + table_rows(spark, registry.ops["rejects"].path)
                == len(fleet)
                and silver_caught_up(spark, registry)
            ),
            600,
            "silver to judge all of bronze",
            interval=3,
        )
        # The input is quiet: once every partition has been for the idleness timeout,
        # the check moves the watermark to the largest partition watermark. (In this
        # process: its command line on the store is the rehearsal's.)
        time.sleep(IDLENESS_S + 1)
        assert check_idle.main(["--pipeline", str(pipeline), "--lakehouse", lakehouse]) == 0
        assert streams.poll() is None
        stop_gracefully(streams)
    # The largest partition watermark: the newest event time less the 5 s bound, less 1 ms.
    newest = spark.read.format("delta").load(registry.bronze.path).selectExpr("max(unix_millis(event_time))")
    assert history(spark, registry)[-1][1:] == (newest.first()[0] - 5_000 - 1, 0, PARTITIONS)

    # End of input, the last late records merged, gold caught up: a batch computation.
    end_the_input(spark, registry)
    late_merge.merge_late(spark, registry, late_merge.TimeRange())
    checkpoint = join(registry.root, "_checkpoints", registry.config.name, "gold")
    context = JobContext("gold", registry.config, registry, "available-now", 1_000, checkpoint)
    assert gold.run(spark, context) == 0
    assert_bronze_reconciles(spark, registry, Manifest.of(fleet), fleet)
    assert set(quarantine_by_status(spark, registry)) == {"merged"}
    assert_reconciles(spark, registry)
    assert engine_silver(spark, registry) == batch_silver(spark, registry)
    assert engine_gold(spark, registry) == batch_gold(spark, registry)
    assert engine_status_events(spark, registry) == batch_status_events(spark, registry)
    # Checkpoints are on the store; nothing of the lakehouse is on this machine's disk.
    assert objects_under(s3_server, f"{lakehouse.removeprefix('s3a://')}/_checkpoints/{registry.config.name}")
    assert not Path("s3a:").exists()
