"""Sensors on the lakehouse's event-time clocks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import datetime, timedelta
from typing import Any

from airflow.configuration import conf
from airflow.sdk import BaseSensorOperator
from airflow.triggers.base import BaseTrigger, TriggerEvent

from spark_jobs.config import load_pipeline
from spark_jobs.tables import lakehouse_root
from tidemark_airflow.lakehouse import pipeline_watermark
from tidemark_airflow.operators import pipeline_file


def as_millis(moment: datetime | str) -> int:
    value = datetime.fromisoformat(moment) if isinstance(moment, str) else moment
    return round(value.timestamp() * 1000)


def has_passed(watermark: int | None, moment_ms: int) -> bool:
    """Whether the watermark has passed ``moment_ms``, as for a window ending there:
    watermark >= moment - 1 ms. No watermark yet has passed nothing."""
    return watermark is not None and watermark >= moment_ms - 1


# A sensor that names no poke_interval reads the watermark this often: Airflow's
# ``[tidemark] watermark_poke_interval`` (``AIRFLOW__TIDEMARK__WATERMARK_POKE_INTERVAL``).
POKE_INTERVAL_OPTION = ("tidemark", "watermark_poke_interval")
DEFAULT_POKE_INTERVAL_S = 60.0


def default_poke_interval() -> float:
    """Seconds between a WatermarkSensor's watermark reads unless it names its own."""
    section, key = POKE_INTERVAL_OPTION
    seconds = conf.getfloat(section, key, fallback=DEFAULT_POKE_INTERVAL_S)
    if seconds <= 0:
        raise ValueError(f"[{section}] {key}={seconds:g}: expected seconds above 0")
    return seconds


class WatermarkTrigger(BaseTrigger):
    """Runs in Airflow's triggerer: reads ``pipeline``'s watermark from the lakehouse
    every ``poll_interval`` seconds (in a thread: the Delta read blocks) and fires
    once it has passed ``moment_ms``."""

    def __init__(self, lakehouse: str, pipeline: str, moment_ms: int, poll_interval: float) -> None:
        super().__init__()
        self.lakehouse = lakehouse
        self.pipeline = pipeline
        self.moment_ms = moment_ms
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        arguments = {
            "lakehouse": self.lakehouse,
            "pipeline": self.pipeline,
            "moment_ms": self.moment_ms,
            "poll_interval": self.poll_interval,
        }
        return f"{type(self).__module__}.{type(self).__qualname__}", arguments

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            watermark = await asyncio.to_thread(pipeline_watermark, self.lakehouse, self.pipeline)
            if has_passed(watermark, self.moment_ms):
                yield TriggerEvent({"watermark": watermark})
                return
            await asyncio.sleep(self.poll_interval)


class WatermarkSensor(BaseSensorOperator):
    """Waits until ``pipeline``'s watermark has passed ``moment``: everything that
    happened before ``moment`` in event time has been seen (late data aside), so
    a report over ``[.., moment)`` is complete. ``moment`` is templated: with
    ``{{ data_interval_end }}`` Airflow's data interval meets the watermark.

    Deferrable by default: while it waits, a :class:`WatermarkTrigger` polls in the
    triggerer and no worker slot is held. ``deferrable=False`` pokes from a worker.
    Without a ``poke_interval`` it polls every :func:`default_poke_interval` seconds."""

    template_fields: Sequence[str] = ("pipeline", "moment")

    def __init__(
        self,
        *,
        pipeline: str,
        moment: datetime | str,
        lakehouse: str | None = None,
        deferrable: bool = True,
        **kwargs: Any,
    ):
        super().__init__(**{"poke_interval": default_poke_interval(), **kwargs})
        self.pipeline = pipeline
        self.moment = moment
        self.lakehouse = lakehouse
        self.deferrable = deferrable

    def poke(self, context: Any) -> bool:
        name = load_pipeline(pipeline_file(self.pipeline)).name
        watermark = pipeline_watermark(lakehouse_root(self.lakehouse), name)
        target = as_millis(self.moment)
        self.log.info("pipeline %s: watermark %s, waiting for >= %s", name, watermark, target - 1)
        return has_passed(watermark, target)

    def execute(self, context: Any) -> None:
        if not self.deferrable:
            super().execute(context)
            return
        if self.poke(context):
            return
        trigger = WatermarkTrigger(
            lakehouse_root(self.lakehouse),
            load_pipeline(pipeline_file(self.pipeline)).name,
            as_millis(self.moment),
            self.poke_interval,
        )
        self.defer(trigger=trigger, method_name="execute_complete", timeout=timedelta(seconds=self.timeout))

    def execute_complete(self, context: Any, event: dict[str, Any]) -> None:
        self.log.info("pipeline watermark %s has passed %s", event["watermark"], self.moment)
