"""Late merges served by a running pipeline application.

A merge in its own process pays a JVM, a Spark session and a cold start of every
Delta table it reads before its first write. ``tidemark run`` keeps all of that warm,
so while it runs it also serves merge requests: a requester drops a request file in
the pipeline's request folder and waits for the result file, and the application's
merge thread runs the very same merge (:func:`~spark_jobs.engine.late_merge.logged_merge`)
beside the streams. The merge competes with no stream either way (its writes have
disjoint footprints), so serving it is only a matter of speed: a requester that finds
no live server, or whose request is not taken up at once, merges in its own process,
and a server that dies mid-merge leaves a claim the next merge finishes.

The protocol is a few files in one folder, moved by renames (atomic on a local file
system, so a request is taken or withdrawn, never both): ``alive`` (the server's
heartbeat), ``<id>.request``, ``<id>.running`` while served, ``<id>.result``. It needs
a lakehouse on a local or shared file system; elsewhere merges run in their own process.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from spark_jobs.lakehouse.space import local_folder

# How often a server says it is alive, and how stale a heartbeat may be before a
# requester stops counting on it.
HEARTBEAT_S = 2.0
ALIVE_WITHIN_S = 10.0
# How often a server looks for requests, and how long a requester waits for its
# request to be taken up before it merges itself.
POLL_S = 0.5
PICKUP_WITHIN_S = 5.0
UNREAD_RESULTS_S = 3600.0


@dataclass(frozen=True)
class MergeRequest:
    """What to merge: windows starting in ``[start, end)`` (ISO-8601; None: unbounded)."""

    start: str | None = None
    end: str | None = None


@dataclass(frozen=True)
class MergeResult:
    succeeded: bool
    message: str


def requests_folder(root: str, pipeline: str) -> Path | None:
    """The pipeline's request folder under a local lakehouse ``root``; None for a
    lakehouse elsewhere (object storage), where merges run in their own process."""
    local = local_folder(root)
    return None if local is None else Path(local) / "_checkpoints" / pipeline / "merge-requests"


def _write_atomically(path: Path, document: dict) -> None:
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    temporary.write_text(json.dumps(document))
    os.replace(temporary, path)


def _moved(source: Path, target: Path) -> bool:
    """Rename ``source`` to ``target``; False when someone else moved it first."""
    try:
        os.rename(source, target)
    except FileNotFoundError:
        return False
    return True


def server_alive(folder: Path) -> bool:
    try:
        heartbeat = json.loads((folder / "alive").read_text())
    except (OSError, ValueError):
        return False
    return time.time() - heartbeat.get("at", 0) <= ALIVE_WITHIN_S


def ask(folder: Path, request: MergeRequest, within_s: float) -> MergeResult | None:
    """Have the live server merge ``request`` and return its result; None when no
    server takes it up (none is live, or it does not take the request within
    :data:`PICKUP_WITHIN_S`), or when the server stops beating before it answers,
    or no answer comes within ``within_s``: the caller then merges itself."""
    if not server_alive(folder):
        return None
    name = uuid.uuid4().hex
    pending, result = folder / f"{name}.request", folder / f"{name}.result"
    _write_atomically(pending, asdict(request))
    deadline = time.monotonic() + PICKUP_WITHIN_S
    while pending.exists():
        if time.monotonic() >= deadline and _moved(pending, folder / f"{name}.withdrawn"):
            (folder / f"{name}.withdrawn").unlink(missing_ok=True)
            return None
        time.sleep(POLL_S / 2)
    deadline = time.monotonic() + within_s
    while not result.exists():
        if time.monotonic() >= deadline or not server_alive(folder):
            print(
                "tidemark merge-late: the pipeline application took the merge but gave no answer; "
                "merging here (its claim, if any, is finished first)",
                file=sys.stderr,
            )
            return None
        time.sleep(POLL_S / 2)
    answer = json.loads(result.read_text())
    result.unlink(missing_ok=True)
    return MergeResult(**answer)


class MergeServer:
    """A pipeline application's merge thread, which takes requests one at a time and
    answers each with ``merge(request)``'s result (an error is a failed result, and
    the server goes on), and its heartbeat thread, which beats through long merges."""

    def __init__(self, folder: Path, merge: Callable[[MergeRequest], str]) -> None:
        self.folder = folder
        self.merge = merge
        self.stopping = threading.Event()
        self.threads = [
            threading.Thread(target=self._serve, name="tidemark-merge-server", daemon=True),
            threading.Thread(target=self._beat, name="tidemark-merge-server-heartbeat", daemon=True),
        ]

    def start(self) -> MergeServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._say_alive()
        for thread in self.threads:
            thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join()
        (self.folder / "alive").unlink(missing_ok=True)

    def _say_alive(self) -> None:
        heartbeat = {"at": time.time(), "host": socket.gethostname(), "pid": os.getpid()}
        _write_atomically(self.folder / "alive", heartbeat)

    def _beat(self) -> None:
        while not self.stopping.wait(HEARTBEAT_S):
            self._say_alive()
            self._forget_unread()

    def _serve(self) -> None:
        while not self.stopping.wait(POLL_S):
            for pending in sorted(self.folder.glob("*.request")):
                self._answer(pending)

    def _answer(self, pending: Path) -> None:
        running = pending.with_suffix(".running")
        if not _moved(pending, running):
            return  # withdrawn by its requester
        try:
            answer = MergeResult(True, self.merge(MergeRequest(**json.loads(running.read_text()))))
        except Exception as error:  # the requester hears of it; the application goes on
            answer = MergeResult(False, f"{type(error).__name__}: {error}"[:2000])
        _write_atomically(pending.with_suffix(".result"), asdict(answer))
        running.unlink(missing_ok=True)

    def _forget_unread(self) -> None:
        """Results no requester came back for (it gave up waiting) are removed after a while."""
        for result in self.folder.glob("*.result"):
            with contextlib.suppress(FileNotFoundError):
                if time.time() - result.stat().st_mtime > UNREAD_RESULTS_S:
                    result.unlink()
