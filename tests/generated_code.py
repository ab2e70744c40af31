"""What Spark compiles from generated code, for tests that a micro-batch reuses it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from spark_jobs.session import CODEGEN_FACTORY_MODE


@contextmanager
def expressions_compiled(spark) -> Iterator[None]:
    """Spark compiles expressions into generated classes meanwhile, as a job under the
    throughput profile does (the tests' session interprets them)."""
    interpreted = spark.conf.get(CODEGEN_FACTORY_MODE)
    spark.conf.set(CODEGEN_FACTORY_MODE, "FALLBACK")
    try:
        yield
    finally:
        spark.conf.set(CODEGEN_FACTORY_MODE, interpreted)


def classes_compiled(spark) -> int:
    """How many classes this session's JVM has compiled from generated code so far
    (a cache hit compiles nothing)."""
    metrics = spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics
    return metrics.METRIC_COMPILATION_TIME().getCount()
