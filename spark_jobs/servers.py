"""What the processes tests, the demo and the bench start on loopback (Kafka, S3,
jobs) share: free ports, a stop that leaves no process behind, and a foreground run."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from typing import Protocol


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def stop_group(process: subprocess.Popen | None, grace_s: float = 20) -> None:
    """SIGTERM the process group ``process`` leads (started with ``start_new_session``),
    then SIGKILL it after ``grace_s``."""
    if process is None or process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


class Server(Protocol):
    process: subprocess.Popen | None

    def start(self) -> object: ...

    def stop(self) -> None: ...


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def serve_in_foreground(server: Server, ready: str) -> None:
    """Start ``server``, print ``ready``, and stop it on Ctrl-C, SIGTERM or SIGHUP."""
    # The server runs in a session of its own, so a service manager's SIGTERM (or a closed
    # terminal's SIGHUP) reaches only this process: treat them like Ctrl-C and stop the
    # server, instead of exiting and leaving it orphaned.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    try:
        server.start()
        print(f"{ready}; Ctrl-C stops it", flush=True)
        assert server.process is not None
        server.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        # A second signal must not cut the stop short and orphan the server after all.
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        server.stop()
