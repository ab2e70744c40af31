"""`make stop` leaves nothing running: the standalone's process group, and the
task processes Airflow put in process groups of their own."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tidemark_airflow.standalone import PID_FILE, processes_of, stop


def sleeper(**extra_env: str) -> subprocess.Popen:
    """A process in a session of its own, returned once it runs. Popen returns as soon as
    exec has begun, and until the kernel has laid out the new program's stack its
    /proc/<pid>/environ reads empty, so a bare ``sleep`` could be missed by a lookup
    made right after."""
    env = {**os.environ, **extra_env}
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; print('running', flush=True); time.sleep(300)"],
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.readline() == "running\n"
    return process


def reaped(process: subprocess.Popen) -> bool:
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        return False
    return True


def test_stop_kills_the_group_and_the_tasks_that_left_it(tmp_path):
    home = tmp_path / "airflow"
    home.mkdir()
    standalone = sleeper(AIRFLOW_HOME=str(home.resolve()))
    escaped_task = sleeper(AIRFLOW_HOME=str(home.resolve()))  # its own session and group
    stranger = sleeper(AIRFLOW_HOME=str(tmp_path / "other"))
    (home / PID_FILE).write_text(f"{standalone.pid}\n")
    try:
        assert set(processes_of(home)) == {standalone.pid, escaped_task.pid}
        started = time.monotonic()
        assert stop(home, grace=2) is True
        assert reaped(standalone) and reaped(escaped_task)
        assert time.monotonic() - started < 30
        assert stranger.poll() is None, "a process of another AIRFLOW_HOME was killed"
        assert not (home / PID_FILE).exists()
        assert stop(home) is False
    finally:
        for process in (standalone, escaped_task, stranger):
            process.kill()
            process.wait()
            process.stdout.close()


def test_stop_does_not_wait_out_its_grace_for_a_group_left_with_a_zombie(tmp_path):
    home = tmp_path / "airflow"
    home.mkdir()
    exited = subprocess.Popen(["true"], start_new_session=True)  # not reaped until stop returns
    (home / PID_FILE).write_text(f"{exited.pid}\n")
    deadline = time.monotonic() + 10
    while Path(f"/proc/{exited.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    started = time.monotonic()
    assert stop(home, grace=20) is True
    assert time.monotonic() - started < 5
    exited.wait()
