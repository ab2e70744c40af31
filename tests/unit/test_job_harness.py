"""The integration tests' long-running jobs end with their test, however it ends."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration.conftest import group_running, kill_hard, wait_for


def alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in {"Z", "X"}


def started_with_a_child(tmp_path: Path):
    """A shell in its own group that started a ``sleep`` (the JVM's Python driver, say)."""
    child_pid = tmp_path / "child.pid"
    block = group_running(["sh", "-c", f"sleep 300 & echo $! > {child_pid}; wait"])
    return block, child_pid


def ends_soon(pid: int) -> bool:
    """SIGKILL reaches a group's members in their own time: give them a moment."""
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def child_of(child_pid: Path) -> int:
    wait_for(lambda: child_pid.exists() and child_pid.read_text().strip(), 10, "the child's pid")
    return int(child_pid.read_text())


def test_a_job_whose_test_fails_is_killed_with_its_whole_process_group(tmp_path):
    block, child_pid = started_with_a_child(tmp_path)
    with pytest.raises(AssertionError), block as process:
        child = child_of(child_pid)
        raise AssertionError("a wait that timed out")
    assert process.returncode == -9
    assert ends_soon(child)


def test_a_job_killed_inside_its_block_ends_the_block_quietly(tmp_path):
    block, child_pid = started_with_a_child(tmp_path)
    with block as process:
        child = child_of(child_pid)
        kill_hard(process)
    assert process.returncode == -9
    assert ends_soon(child)
