"""Sensors on the lakehouse's event-time clocks."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from airflow.sdk import BaseSensorOperator

from spark_jobs.config import load_pipeline
from spark_jobs.tables import lakehouse_root
from tidemark_airflow.lakehouse import pipeline_watermark
from tidemark_airflow.operators import pipeline_file


def as_millis(moment: datetime | str) -> int:
    value = datetime.fromisoformat(moment) if isinstance(moment, str) else moment
    return round(value.timestamp() * 1000)


class WatermarkSensor(BaseSensorOperator):
    """Waits until ``pipeline``'s watermark has passed ``moment``: everything that
    happened before ``moment`` in event time has been seen (late data aside), so
    a report over ``[.., moment)`` is complete. ``moment`` is templated: with
    ``{{ data_interval_end }}`` Airflow's data interval meets the watermark.

    Passed, as for a window end: watermark >= moment - 1 ms."""

    template_fields: Sequence[str] = ("pipeline", "moment")

    def __init__(self, *, pipeline: str, moment: datetime | str, lakehouse: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.moment = moment
        self.lakehouse = lakehouse

    def poke(self, context: Any) -> bool:
        name = load_pipeline(pipeline_file(self.pipeline)).name
        watermark = pipeline_watermark(lakehouse_root(self.lakehouse), name)
        target = as_millis(self.moment)
        self.log.info("pipeline %s: watermark %s, waiting for >= %s", name, watermark, target - 1)
        return watermark is not None and watermark >= target - 1
