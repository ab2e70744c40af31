"""Small builders for reference-model inputs, shared by the model's tests."""

from __future__ import annotations

from collections.abc import Iterable

from spark_jobs.eventtime import Batch, Record, Rules, WatermarkSpec, WindowSpec

SECOND = 1_000


def sensor(seconds: int, partition: int = 0, key: str = "s1") -> Record:
    """Seed 000's WaterSensor(id, ts, vc): ts in seconds, vc == ts."""
    return Record(partition, seconds * SECOND, {"id": key, "vc": seconds})


def one_per_batch(records: Iterable[Record], step_ms: int = SECOND) -> list[Batch]:
    """Each record in its own micro-batch, processing time advancing by ``step_ms``:
    the watermark is re-emitted after every record, as in the article's runs."""
    return [Batch([record], processing_time=index * step_ms) for index, record in enumerate(records)]


def rules(
    strategy: str = "bounded",
    bound_s: int = 0,
    lateness_s: int = 0,
    size_s: int = 10,
    slide_s: int | None = None,
    offset_s: int = 0,
    idleness_s: int | None = None,
    partitions: tuple = (),
) -> Rules:
    window = WindowSpec(size_s * SECOND, (slide_s or size_s) * SECOND, offset_s * SECOND)
    idleness = None if idleness_s is None else idleness_s * SECOND
    return Rules(
        window=window,
        watermark=WatermarkSpec(strategy, bound_s * SECOND if strategy == "bounded" else 0, idleness),
        allowed_lateness_ms=lateness_s * SECOND,
        key=("id",),
        measures={"vc": ("count", "sum")},
        partitions=partitions,
    )
