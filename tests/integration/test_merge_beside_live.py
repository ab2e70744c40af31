"""Five late merges in a row beside a live pipeline at 1-second triggers, with late
records in nearly every micro-batch and another Spark job loading the machine, some
in their own process and the rest served by the pipeline's application: each merge
finishes, within a bounded number of conflicts, and nothing is lost or doubled. The
merge never competes with a stream for what the stream writes."""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

import pytest

from spark_jobs.engine import late_merge
from spark_jobs.generator import FleetSpec, generate, write_landing
from spark_jobs.jobs import gold
from spark_jobs.jobs.common import JobContext
from spark_jobs.submit import spark_submit_binary, submit_env
from spark_jobs.tables import join
from tests.integration.conftest import (
    group_running,
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
from tests.integration.test_late_merge import (
    assert_reconciles,
    end_the_input,
    quarantine_by_status,
    silver_caught_up,
    stop_gracefully,
    table_rows,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

MERGES = 5
# A merge retries a write that lost to a concurrent writer; beside the streams only a
# late-track mark racing the offline stream's own fold of the same claim may lose.
MOST_RETRIES_PER_MERGE = 2
# The load runs at the lowest CPU priority: alone it takes every cycle the pipeline and the
# merges leave; in the suite, the other worker's tests load the machine as well, and a
# third process at full priority would only lengthen the suite.
LOAD = (spark_submit_binary(), "--master", "local[1]", str(Path(__file__).with_name("busy_spark_job.py")))
LOWEST_PRIORITY = 19


def lowest_priority(process_group: int) -> None:
    """The load's session at the lowest priority. Its own session is a scheduling group of
    its own (Linux's autogroup, on by default), which shares the CPU evenly with the
    suite's whatever the nice value of the processes in it: a niced load took a third of
    the machine beside the suite. The group's own nice value is what weighs."""
    autogroup = Path(f"/proc/{process_group}/autogroup")
    if autogroup.exists():
        autogroup.write_text(str(LOWEST_PRIORITY))
    os.setpriority(os.PRIO_PGRP, process_group, LOWEST_PRIORITY)


def test_merges_beside_a_live_pipeline_under_load_each_finish_and_lose_and_double_nothing(spark, tmp_path):
    landing, lakehouse = tmp_path / "landing", tmp_path / "lakehouse"
    pipeline = write_pipeline(
        tmp_path,
        source={"kind": "files", "path": str(landing), "format": "json", "max_files_per_trigger": 1},
    )
    registry = registry_for(pipeline, lakehouse)
    # Late uploads 1.5-5 minutes behind, past the 30 s lateness: a tenth of the records.
    fleet = generate(
        FleetSpec(
            devices=8,
            partitions=3,
            seed=23,
            duration_ms=30 * 60_000,
            late_ratio=0.1,
            late_delay_ms=(90_000, 300_000),
        )
    )
    per_file = 16
    outputs = []
    with (
        job_running("run", pipeline, lakehouse, "--trigger", "continuous", "--interval", "1s") as streams,
        group_running(list(LOAD), submit_env()) as load,
    ):
        lowest_priority(load.pid)
        # A file a second, each a 1-second micro-batch, while the merges run.
        feeder = threading.Thread(target=write_landing, args=(fleet, landing, per_file, "json", per_file))
        feeder.start()
        try:
            wait_for(lambda: table_rows(spark, registry.quarantine.path) > 0, 300, "a quarantined record", 2)
            for index in range(MERGES):
                # Every third merge in its own process (here), the rest served by the application.
                where = ("--here",) if index % 3 == 0 else ()
                started = time.monotonic()
                ran = run_here("merge_late", pipeline, lakehouse, *where, streaming=False)
                outputs.append(ran.stdout)
                assert ran.returncode == 0, ran.stdout[-3000:]
                print(f"{time.monotonic() - started:.1f} s: {ran.stdout.strip().splitlines()[-1]}")
            merges_beside_streams = streams.poll() is None and load.poll() is None
            feeder.join()
            wait_for(
                lambda: (
                    table_rows(spark, registry.bronze.path) == len(fleet)
                    and silver_caught_up(spark, registry)
                ),
                600,
                "silver to judge all of bronze",
                interval=3,
            )
        finally:
            feeder.join()
            stop_gracefully(streams)
    assert merges_beside_streams, "the streams or the load died while the merges ran"
    retries = [len(re.findall(r"conflicted with .*; attempt \d+ of", output)) for output in outputs]
    merged = [int(re.search(r"merged (\d+) late records", output).group(1)) for output in outputs]
    print(f"late records merged per merge: {merged}; retries per merge: {retries}")
    assert max(retries) <= MOST_RETRIES_PER_MERGE
    assert sum(merged) > 0
    served = ["the pipeline application merged" in output for output in outputs]
    assert served == [index % 3 != 0 for index in range(MERGES)]
    merges = spark.sql(
        f"SELECT started_at, ended_at, late FROM delta.`{registry.ops['runs'].path}` "
        "WHERE job = 'merge_late' AND status = 'succeeded'"
    ).collect()
    clocks = registry.ops["watermark_history"].path
    clock_commits = spark.sql(f"DESCRIBE HISTORY delta.`{clocks}`").collect()
    overlapped = [
        merge
        for merge in merges
        if merge.late > 0
        and any(merge.started_at <= commit.timestamp <= merge.ended_at for commit in clock_commits)
    ]
    assert overlapped, "no merge folded records in while silver committed batches"

    # End of input, the last late records merged, gold caught up: a batch computation.
    end_the_input(spark, registry)
    late_merge.merge_late(spark, registry, late_merge.TimeRange())
    checkpoint = join(registry.root, "_checkpoints", registry.config.name, "gold")
    context = JobContext("gold", registry.config, registry, "available-now", 1_000, checkpoint)
    assert gold.run(spark, context) == 0
    assert set(quarantine_by_status(spark, registry)) == {"merged"}
    assert engine_silver(spark, registry) == batch_silver(spark, registry)
    assert engine_gold(spark, registry) == batch_gold(spark, registry)
    assert engine_status_events(spark, registry) == batch_status_events(spark, registry)
    assert_reconciles(spark, registry)
