"""Streaming checkpoints as Tidemark reads them: a query's id (its app id), the
leftovers of a first batch a kill interrupted, and the last log files a crash of the
machine left incomplete."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from spark_jobs.lakehouse.files import hadoop_file, read_text
from spark_jobs.lakehouse.log import newest_stream_commit


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


def is_checkpoint(spark: SparkSession, folder: str) -> bool:
    """Whether a stream has started from ``folder`` (its id is written first)."""
    filesystem, metadata = hadoop_file(spark, folder, "metadata")
    return filesystem.exists(metadata)


def born_ms(spark: SparkSession, checkpoint: str) -> int:
    """When the stream's checkpoint (and with it its app id) was made."""
    filesystem, metadata = hadoop_file(spark, checkpoint, "metadata")
    return filesystem.getFileStatus(metadata).getModificationTime()


# Spark's streaming logs (offsets/, commits/): a version line, then one JSON entry per
# line; an offsets file has the batch's metadata and one offset per source ("-": none).
LOG_VERSION = re.compile(r"v[0-9]+")


def is_whole_log_file(text: str, folder: str, previous: str | None) -> bool:
    """Whether ``text`` is a whole file of the checkpoint's ``folder`` log (offsets or
    commits), as Spark writes one: a file a crash cut short has fewer entries than its
    predecessor (``previous``, the batch before's) or an unfinished one."""
    lines = text.splitlines()
    if not lines or not LOG_VERSION.fullmatch(lines[0]):
        return False
    entries = lines[1:]
    if folder == "commits":
        expected = 1
    elif previous is not None:
        expected = len(previous.splitlines()) - 1
    else:
        expected = max(2, len(entries))  # the metadata and at least one source
    if len(entries) != expected:
        return False
    for entry in entries:
        if entry == "-":
            continue
        try:
            json.loads(entry)
        except ValueError:
            return False
    return True


@dataclass(frozen=True)
class DamagedLogFile:
    """The last file of a checkpoint's offsets or commits log, cut short."""

    folder: str
    batch_id: int
    path: str


def damaged_log_files(spark: SparkSession, checkpoint: str) -> list[DamagedLogFile]:
    """The last file of the checkpoint's offsets and commits logs, each where it is
    not whole (:func:`is_whole_log_file`); a crash writes no other file of them."""
    found = []
    for folder in ("offsets", "commits"):
        batches = log_batches(spark, checkpoint, folder)
        if not batches:
            continue
        last = batches[-1]
        previous = read_text(spark, checkpoint, folder, str(batches[-2])) if len(batches) > 1 else None
        text = checked_text(spark, checkpoint, folder, str(last))
        if text is None or not is_whole_log_file(text, folder, previous):
            found.append(
                DamagedLogFile(folder, last, hadoop_file(spark, checkpoint, folder, str(last))[1].toString())
            )
    return found


def log_batches(spark: SparkSession, checkpoint: str, folder: str) -> list[int]:
    """The batch ids of the checkpoint's ``folder`` log (offsets or commits), in order."""
    filesystem, path = hadoop_file(spark, checkpoint, folder)
    if not filesystem.exists(path):
        return []
    names = (status.getPath().getName() for status in filesystem.listStatus(path))
    return sorted(int(name) for name in names if name.isdigit())


def checked_text(spark: SparkSession, *path: str) -> str | None:
    """A log file's text; None where its content fails the checksum the file system
    keeps beside it (a file cut short after it was written whole). Any other error
    passes: a store that cannot be read says nothing of the file."""
    try:
        return read_text(spark, *path)
    except Py4JJavaError as error:
        if "ChecksumException" in str(error.java_exception.getClass().getName()):
            return None
        raise


def repair_command(pipeline: str, root: str) -> str:
    """The command that repairs what a crash of the machine damaged in a lakehouse."""
    return f"`tidemark repair --pipeline {pipeline} --lakehouse {root}`"


class UnsafeRepair(RuntimeError):
    """A damaged file whose removal could lose or double records."""


def repair_checkpoint(spark: SparkSession, checkpoint: str, tables: Sequence[str]) -> list[str]:
    """Remove the checkpoint's damaged log files where that is safe, and return their
    paths; raise :class:`UnsafeRepair`, removing nothing, where it is not.

    A damaged commits file: its batch reached every table, and each skips a batch it
    has (Tidemark's writes are labelled with the stream's id and batch): without the
    file, Spark runs the batch again from its offsets, which writes nothing twice.
    A damaged offsets file: safe only when none of ``tables`` (the pipeline's) holds a
    commit of that batch or a later one; Spark then plans the batch afresh. Had a table
    taken it, a new plan could cover other records than the batch it took."""
    damaged = damaged_log_files(spark, checkpoint)
    offsets = [file for file in damaged if file.folder == "offsets"]
    if offsets:
        app_id, born = stream_app_id(spark, checkpoint), born_ms(spark, checkpoint)
        batch = offsets[0].batch_id
        for table in tables:
            newest = newest_stream_commit(spark, table, app_id, born)
            if newest is not None and newest[1] >= batch:
                raise UnsafeRepair(
                    f"{offsets[0].path} is damaged, but batch {newest[1]} of this stream committed to "
                    f"{table}: removing it could make the stream read other records for batch {batch}. "
                    "It cannot be repaired in place: restore the checkpoint from a backup, or rebuild "
                    "the tables from the input with tidemark replay "
                    "(docs/concepts/exactly-once.md#damaged-checkpoint-files)"
                )
    removed = []
    for file in damaged:
        filesystem, path = hadoop_file(spark, file.path)
        filesystem.delete(path, False)
        removed.append(file.path)
    return removed
