"""``tidemark run``: a pipeline's streams (bronze, silver, gold, offline detection) as
queries of one Spark application.

One driver pays one JVM start-up, one session and one set of warm plans instead of
four. Each query keeps its own checkpoint (the per-job default), so a pipeline can
move between this and per-job submits (``tidemark bronze`` ...; scale-out) without
losing its place, and exactly-once is what each job gives alone.

- ``--trigger continuous``: the four queries run side by side. The first to fail
  stops the others and the process exits 1, so the supervisor (Airflow's task
  retries) restarts the whole set.
- ``--trigger available-now``: the chain the per-job DAG runs (bronze, then silver,
  then gold and offline detection together), each stage draining what the one
  before it wrote; ``--flush`` ends the input after silver.

The stages and their sessions are :mod:`spark_jobs.jobs.stages`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial

from pyspark.sql import SparkSession

from spark_jobs.config import ConfigError
from spark_jobs.engine import watermark_steps
from spark_jobs.engine.late_merge import TimeRange, logged_merge
from spark_jobs.engine.merge_requests import MergeRequest, MergeServer, requests_folder
from spark_jobs.jobs.common import (
    JobContext,
    exit_with_named_errors,
    job_parser,
    run_streams,
    stream_busy,
    stream_session,
)
from spark_jobs.jobs.stages import STAGES, job_context, stage_streams
from spark_jobs.tables import TableRegistry


def run(spark: SparkSession, pipeline: JobContext, flush: bool = False) -> int:
    """Run the pipeline's streams in this application; the process exit code. Running
    continuously, the application serves late merges as well."""
    if pipeline.trigger == "continuous":
        streams = [stream for stage in STAGES for stream in stage_streams(spark, pipeline, stage)]
        offline = next((stream for stream in streams if stream.context.job == "offline"), None)
        server = merge_server(
            spark.newSession(), pipeline.registry, None if offline is None else partial(stream_busy, offline)
        )
        try:
            return run_streams(streams)
        finally:
            if server is not None:
                server.stop()
    for index, stage in enumerate(STAGES):
        code = run_streams(stage_streams(spark, pipeline, stage))
        if code != 0:
            return code
        if index == 1 and flush:
            silver_checkpoint = job_context(pipeline, "silver").checkpoint
            watermark_steps.flush(spark.newSession(), pipeline.registry, after_stream=silver_checkpoint)
    return 0


def merge_server(
    spark: SparkSession, registry: TableRegistry, offline_busy: Callable[[], bool] | None
) -> MergeServer | None:
    """The application's server of late merges, started (None where the lakehouse is
    not on a file system); ``offline_busy`` tells of the offline stream beside it."""
    folder = requests_folder(registry.root, registry.config.name)
    if folder is None:
        return None

    def merge(request: MergeRequest) -> str:
        window = TimeRange.parsed(request.start, request.end)
        return logged_merge(spark, registry, window, offline_busy)

    return MergeServer(folder, merge).start()


@exit_with_named_errors
def main(argv: list[str] | None = None) -> int:
    parser = job_parser(
        "run",
        "A pipeline's bronze, silver, gold and offline streams as queries of one Spark application.",
        (
            "tidemark run --pipeline telemetry --interval 30s",
            "tidemark run --pipeline telemetry --trigger available-now --flush",
        ),
    )
    parser.add_argument(
        "--flush",
        action="store_true",
        help="after an available-now run of silver, end the input: the watermark moves to +inf",
    )
    args = parser.parse_args(argv)
    if args.checkpoint is not None:
        raise ConfigError("--checkpoint", "each query keeps its job's own checkpoint; run the job alone")
    if args.flush and args.trigger != "available-now":
        raise ConfigError("--flush", "needs --trigger available-now")
    pipeline = JobContext.from_args("run", args)
    return run(stream_session(pipeline), pipeline, args.flush)


if __name__ == "__main__":
    sys.exit(main())
