"""Event-time rules in pure Python (no Spark): the reference model and the
pieces the Spark jobs share with it (generators, the valve, windows, timers)."""

from spark_jobs.eventtime.clock import MAX_WATERMARK, MIN_WATERMARK
from spark_jobs.eventtime.generators import PartitionGenerator, WatermarkSpec
from spark_jobs.eventtime.model import (
    Batch,
    BatchWatermark,
    Firing,
    ModelResult,
    QuarantinedPair,
    Record,
    ReferencePipeline,
    Rules,
    WindowResult,
    run_reference,
)
from spark_jobs.eventtime.sessions import ReferenceSessions
from spark_jobs.eventtime.timers import OfflineDetector, StatusEvent
from spark_jobs.eventtime.valve import WatermarkValve
from spark_jobs.eventtime.windows import SessionSpec, Window, WindowSpec

__all__ = [
    "MAX_WATERMARK",
    "MIN_WATERMARK",
    "Batch",
    "BatchWatermark",
    "Firing",
    "ModelResult",
    "OfflineDetector",
    "PartitionGenerator",
    "QuarantinedPair",
    "Record",
    "ReferencePipeline",
    "ReferenceSessions",
    "Rules",
    "SessionSpec",
    "StatusEvent",
    "WatermarkSpec",
    "WatermarkValve",
    "Window",
    "WindowResult",
    "WindowSpec",
    "run_reference",
]
