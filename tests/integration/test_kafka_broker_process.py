"""`python -m spark_jobs.kafka_broker` run as a service manager runs it: stopped with SIGTERM.

The broker JVM runs in a session of its own, so a signal to the Python process never
reaches it: unless the Python process stops the broker itself, the JVM outlives it,
orphaned, holding its ports and data folder."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import pytest

from spark_jobs.servers import free_port

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/<pid>/stat), None if it is gone or a
    zombie; comparing it guards against the pid being reused by another process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the command name may hold spaces
    state, start = fields[0], fields[19]
    return None if state in ("Z", "X") else start


def _broker_jvms(folder: Path) -> list[int]:
    """Pids of the `kafka.Kafka` JVMs whose command line names a file in `folder`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"kafka.Kafka" in argv and any(str(folder).encode() in arg for arg in argv):
            found.append(int(entry.name))
    return found


def _read_lines(stream: IO[str], lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def test_sigterm_stops_the_broker_jvm_and_exits_0(tmp_path):
    folder = tmp_path / "kafka"
    process = subprocess.Popen(
        [sys.executable, "-m", "spark_jobs.kafka_broker", "--port", str(free_port()), "--dir", str(folder)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(process.stdout, lines), daemon=True)
    reader.start()
    jvm, jvm_start = None, None
    try:
        output = []
        deadline = time.monotonic() + 90
        while not any("ready" in line for line in output):
            try:
                line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                pytest.fail(f"no ready line after 90 s; output so far:\n{''.join(output)}")
            if line is None:
                pytest.fail(f"broker exited with {process.wait()} before ready:\n{''.join(output)}")
            output.append(line)

        jvms = _broker_jvms(folder)
        assert len(jvms) == 1, f"expected one broker JVM for {folder}, found {jvms}"
        jvm = jvms[0]
        jvm_start = _start_time(jvm)
        assert jvm_start is not None

        began = time.monotonic()
        process.send_signal(signal.SIGTERM)
        try:
            returncode = process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            pytest.fail("python -m spark_jobs.kafka_broker still running 40 s after SIGTERM")
        print(f"stopped {time.monotonic() - began:.1f} s after SIGTERM")

        assert _start_time(jvm) != jvm_start, f"broker JVM {jvm} outlived its Python process (orphaned)"
        assert returncode == 0, f"exited {returncode} on SIGTERM:\n{''.join(output)}"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
        # Whatever JVM this test started is gone afterwards, even one that never got ready.
        for left in _broker_jvms(folder):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(left, signal.SIGKILL)  # the JVM leads its own session and group
        reader.join(timeout=10)


def test_the_broker_jvm_compiles_with_c1_alone_and_collects_serially(kafka_broker):
    flags = subprocess.run(
        ["jcmd", str(kafka_broker.process.pid), "VM.flags"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert "-XX:TieredStopAtLevel=1" in flags
    assert "-XX:+UseSerialGC" in flags
