"""Stream health from a Structured Streaming checkpoint, without Spark.

A micro-batch writes ``offsets/<id>`` when it starts and ``commits/<id>`` when
it is done. A batch whose offsets are older than the stall limit with no commit
means the stream is alive but stuck (a hung task, a lost executor, a lock). An
application that runs several queries (``tidemark run``) is watched through the
folder holding their checkpoints. Checkpoints are read through pyarrow's file
systems: on the local disk and on object storage alike."""

from __future__ import annotations

import posixpath
import time
from dataclasses import dataclass
from datetime import timedelta

from pyarrow import fs

from spark_jobs.object_store import pyarrow_filesystem

# How long a micro-batch may go without committing before its stream counts as stalled:
# the streaming DAG's watchdog kills it then, and the Watermarks page says so.
STALL_AFTER = timedelta(minutes=15)


def _batch_ids(folder: str) -> dict[int, float]:
    """Batch id -> modification time of the checkpoint log files in ``folder``."""
    filesystem, path = pyarrow_filesystem(folder)
    # Spark purges old batches' files as it goes: a listing holds only what it found.
    listed = filesystem.get_file_info(fs.FileSelector(path, allow_not_found=True))
    return {
        int(info.base_name): info.mtime.timestamp()
        for info in listed
        if info.base_name.isdigit() and info.type == fs.FileType.File
    }


def _is_checkpoint(folder: str) -> bool:
    filesystem, path = pyarrow_filesystem(posixpath.join(folder, "offsets"))
    return filesystem.get_file_info(path).type == fs.FileType.Directory


def _subfolders(folder: str) -> list[str]:
    filesystem, path = pyarrow_filesystem(folder)
    listed = filesystem.get_file_info(fs.FileSelector(path, allow_not_found=True))
    return sorted(info.base_name for info in listed if info.type == fs.FileType.Directory)


def stalled_batch(
    checkpoint: str, stall_after: timedelta, now: float | None = None, watched_since: float = 0.0
) -> str | None:
    """Why the stream at ``checkpoint`` is stalled, or None when it is healthy
    (idle between batches, or still within the limit on its current batch).

    A batch counts from when it started or from ``watched_since``, whichever is
    later: a stream restarted after a kill re-runs its uncommitted batch without
    rewriting its offsets, and must get the whole limit to commit it."""
    live = liveness(checkpoint)
    now = time.time() if now is None else now
    if not live.is_stalled(stall_after, now, watched_since):
        return None
    running_for = live.running_for(now, watched_since)
    return f"micro-batch {live.running_batch} has gone {running_for:.0f} s without committing"


def stalled_query(
    folder: str, stall_after: timedelta, now: float | None = None, watched_since: float = 0.0
) -> str | None:
    """:func:`stalled_batch` of the checkpoint at ``folder``, or, when ``folder``
    holds several queries' checkpoints (a pipeline's), of the first of them stalled,
    named."""
    queries = [name for name in _subfolders(folder) if _is_checkpoint(posixpath.join(folder, name))]
    if _is_checkpoint(folder) or not queries:
        return stalled_batch(folder, stall_after, now, watched_since)
    for name in queries:
        reason = stalled_batch(posixpath.join(folder, name), stall_after, now, watched_since)
        if reason is not None:
            return f"{name}: {reason}"
    return None


@dataclass(frozen=True)
class Liveness:
    """A stream's last committed micro-batch and the one at work, from its checkpoint."""

    last_commit: int | None = None
    committed_at: float | None = None
    running_batch: int | None = None
    running_since: float | None = None

    def running_for(self, now: float, watched_since: float = 0.0) -> float | None:
        """Seconds the batch at work has been at it, from the later of its start and
        ``watched_since``; None between batches."""
        return None if self.running_since is None else now - max(self.running_since, watched_since)

    def is_stalled(self, stall_after: timedelta, now: float, watched_since: float = 0.0) -> bool:
        """Whether the batch at work has gone ``stall_after`` without committing."""
        running_for = self.running_for(now, watched_since)
        return running_for is not None and running_for >= stall_after.total_seconds()


def liveness(checkpoint: str) -> Liveness:
    """What the checkpoint at ``checkpoint`` says of its stream (empty before its first batch)."""
    started = _batch_ids(posixpath.join(checkpoint, "offsets"))
    committed = _batch_ids(posixpath.join(checkpoint, "commits"))
    last = max(committed, default=None)
    newest = max(started, default=None)
    running = newest if newest is not None and newest not in committed else None
    return Liveness(
        last_commit=last,
        committed_at=None if last is None else committed[last],
        running_batch=running,
        running_since=None if running is None else started[running],
    )
