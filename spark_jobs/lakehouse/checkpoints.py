"""Streaming checkpoints as Tidemark reads them: a query's id (its app id) and the
leftovers of a first batch a kill interrupted."""

from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession

from spark_jobs.lakehouse.files import hadoop_file, read_text


def is_unfinished_log_write(name: str) -> bool:
    """A temporary file of Spark's atomic checkpoint writes (``.<batch>.<uuid>.tmp``,
    and its ``.crc``), left behind when the process died before the rename."""
    return name.startswith(".") and (name.endswith(".tmp") or name.endswith(".tmp.crc"))


def discard_unfinished_first_batch(spark: SparkSession, checkpoint: str) -> list[str]:
    """Remove what a process killed while writing its first offset left in the
    checkpoint's ``offsets`` and ``commits`` folders: only temporary files, and only
    when no batch was ever logged. Spark would otherwise refuse to start batch 0
    (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY) and the job could never run again.
    Returns the removed paths."""

    filesystem, _ = hadoop_file(spark, checkpoint)

    def entries(folder: str) -> list:
        _, path = hadoop_file(spark, checkpoint, folder)
        return [status.getPath() for status in filesystem.listStatus(path)] if filesystem.exists(path) else []

    if any(path.getName().isdigit() for path in entries("offsets")):
        return []
    removed = []
    for folder in ("offsets", "commits"):
        for path in entries(folder):
            if is_unfinished_log_write(path.getName()) and filesystem.delete(path, False):
                removed.append(path.toString())
    if removed:
        print(f"tidemark: removed an unfinished first batch from {checkpoint}: {removed}", file=sys.stderr)
    return removed


def stream_app_id(spark: SparkSession, checkpoint: str) -> str:
    """The streaming query's id, stored in its checkpoint: stable across restarts
    from the same checkpoint, new when the checkpoint is reset (so a reset stream,
    whose batch ids restart at 0, is not mistaken for a replay)."""
    return json.loads(read_text(spark, checkpoint, "metadata"))["id"]
