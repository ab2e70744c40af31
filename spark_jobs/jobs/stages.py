"""A pipeline's streams in the order their inputs exist: bronze, then silver, then
gold and offline detection side by side (both read only what silver wrote). Each
job runs in a session of its own (``newSession``: one SparkContext, separate SQL
settings), because its idempotent Delta writes are made under session settings
(the txn app id and version) that must not leak into a query beside it."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import SparkSession

from spark_jobs.jobs import bronze, gold, offline, silver
from spark_jobs.jobs.common import JobContext, Stream, default_checkpoint

StreamFactory = Callable[[SparkSession, JobContext], Stream | None]
Stage = tuple[tuple[str, StreamFactory], ...]
DOWNSTREAM: Stage = (("gold", gold.stream), ("offline", offline.stream))
STAGES: tuple[Stage, ...] = ((("bronze", bronze.stream),), (("silver", silver.stream),), DOWNSTREAM)


def job_context(pipeline: JobContext, job: str) -> JobContext:
    """The context ``job`` has when submitted alone: its own default checkpoint."""
    registry = pipeline.registry
    checkpoint = default_checkpoint(registry, job)
    return JobContext(job, pipeline.config, registry, pipeline.trigger, pipeline.interval_ms, checkpoint)


def stage_streams(spark: SparkSession, pipeline: JobContext, stage: Stage) -> list[Stream]:
    """The stage's streams, each in a new session of ``spark``'s application; a job
    whose pipeline section is absent has none."""
    built = (factory(spark.newSession(), job_context(pipeline, job)) for job, factory in stage)
    return [stream for stream in built if stream is not None]
