"""The WatermarkSensor and the trigger it defers to: the passing rule, the trigger on a
scripted series of watermarks and on the reader's lakehouse (written by the real
delta-spark), its serialization, and the sensor's choice between returning and
deferring."""

from __future__ import annotations

import asyncio
import importlib
from datetime import UTC, datetime

import pytest
from airflow.exceptions import AirflowConfigException
from airflow.sdk.exceptions import TaskDeferred
from tidemark_airflow import sensors
from tidemark_airflow.sensors import WatermarkSensor, WatermarkTrigger, has_passed

from tests.unit.test_lakehouse_reader import root  # noqa: F401 (the reader's lakehouse fixture)

# The reader's lakehouse: pipeline "telemetry" has watermark 7,000 ms.
TELEMETRY_WATERMARK = 7_000


def first_event(trigger: WatermarkTrigger) -> dict:
    async def first() -> dict:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(asyncio.wait_for(first(), 60))


def at_millis(millis: int) -> datetime:
    return datetime.fromtimestamp(millis / 1000, UTC)


def test_a_moment_is_passed_once_the_watermark_reaches_one_millisecond_before_it():
    assert has_passed(7_000, 7_001)
    assert not has_passed(7_000, 7_002)
    assert not has_passed(None, -(2**62))


def test_the_trigger_fires_on_the_first_read_that_passes_the_moment(monkeypatch):
    reads = [None, 6_999, 7_001, 9_999]
    monkeypatch.setattr(sensors, "pipeline_watermark", lambda lakehouse, pipeline: reads.pop(0))
    assert first_event(WatermarkTrigger("/lake", "telemetry", 7_002, 0)) == {"watermark": 7_001}
    assert reads == [9_999]


def test_the_trigger_reads_the_pipeline_watermark_from_the_lakehouse(root):  # noqa: F811
    trigger = WatermarkTrigger(root, "telemetry", TELEMETRY_WATERMARK + 1, 0)
    assert first_event(trigger) == {"watermark": TELEMETRY_WATERMARK}


def test_the_trigger_is_rebuilt_from_what_it_serializes():
    trigger = WatermarkTrigger("/lake", "telemetry", 7_002, 60.0)
    classpath, arguments = trigger.serialize()
    module, name = classpath.rsplit(".", 1)
    rebuilt = getattr(importlib.import_module(module), name)(**arguments)
    assert rebuilt.serialize() == (classpath, arguments)
    assert arguments == {
        "lakehouse": "/lake",
        "pipeline": "telemetry",
        "moment_ms": 7_002,
        "poll_interval": 60.0,
    }


def sensor(root: str, moment_ms: int) -> WatermarkSensor:  # noqa: F811
    moment = at_millis(moment_ms)
    return WatermarkSensor(
        task_id="hour_complete", pipeline="telemetry", moment=moment, lakehouse=root, poke_interval=5
    )


def test_the_sensor_returns_at_once_when_the_watermark_has_passed(root):  # noqa: F811
    assert sensor(root, TELEMETRY_WATERMARK + 1).execute({}) is None


def test_the_sensor_defers_to_a_trigger_for_its_moment_when_the_watermark_has_not_passed(root):  # noqa: F811
    with pytest.raises(TaskDeferred) as deferred:
        sensor(root, TELEMETRY_WATERMARK + 2).execute({})
    trigger = deferred.value.trigger
    assert isinstance(trigger, WatermarkTrigger)
    assert trigger.serialize()[1] == {
        "lakehouse": root,
        "pipeline": "telemetry",
        "moment_ms": TELEMETRY_WATERMARK + 2,
        "poll_interval": 5,
    }
    assert deferred.value.method_name == "execute_complete"


POKE_INTERVAL_VARIABLE = "AIRFLOW__TIDEMARK__WATERMARK_POKE_INTERVAL"


def deferred_poll_interval(root: str, **kwargs) -> float:  # noqa: F811
    moment = at_millis(TELEMETRY_WATERMARK + 2)
    waiting = WatermarkSensor(
        task_id="hour_complete", pipeline="telemetry", moment=moment, lakehouse=root, **kwargs
    )
    with pytest.raises(TaskDeferred) as deferred:
        waiting.execute({})
    return deferred.value.trigger.serialize()[1]["poll_interval"]


def test_a_sensor_without_a_poke_interval_polls_every_minute(root, monkeypatch):  # noqa: F811
    monkeypatch.delenv(POKE_INTERVAL_VARIABLE, raising=False)
    assert deferred_poll_interval(root) == 60


def test_a_sensor_without_a_poke_interval_polls_as_often_as_airflows_tidemark_option_says(
    root,  # noqa: F811
    monkeypatch,
):
    monkeypatch.setenv(POKE_INTERVAL_VARIABLE, "7")
    assert deferred_poll_interval(root) == 7


def test_a_sensors_own_poke_interval_wins_over_the_option(root, monkeypatch):  # noqa: F811
    monkeypatch.setenv(POKE_INTERVAL_VARIABLE, "7")
    assert deferred_poll_interval(root, poke_interval=30) == 30


@pytest.mark.parametrize("value", ["0", "-5", "soon"])
def test_a_poke_interval_option_that_is_no_positive_number_is_refused_by_name(monkeypatch, value):
    monkeypatch.setenv(POKE_INTERVAL_VARIABLE, value)
    with pytest.raises((ValueError, AirflowConfigException), match="watermark_poke_interval"):
        WatermarkSensor(task_id="hour_complete", pipeline="telemetry", moment=at_millis(0))
