"""CPU seconds per test: on a machine whose cores are busy, the suite's wall time is
its CPU work divided by the cores, so this, not ``--durations``, says what to cut.

    TIDEMARK_CPU_REPORT=/tmp/cpu make test   # tests/conftest.py loads this plugin
    .venv/bin/python -m tests.tools.cpu_accounting /tmp/cpu

A test's CPU is the pytest process's own, its reaped children's (a spark-submit that
ran to its end), and what its live descendants (the session's JVM, a module's
servers) used during it. A process whose parent exited before it (an Airflow task
after its supervisor) is reparented to init and counted nowhere: the figures of the
Airflow tests are a floor.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

REPORT_VARIABLE = "TIDEMARK_CPU_REPORT"
TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Sample:
    """CPU seconds at one moment: this process's, its reaped children's, and each live
    descendant's (with the children it has reaped)."""

    own: float
    reaped: float
    live: Mapping[int, float]


def descendants(parents: Mapping[int, int], root: int) -> set[int]:
    """The pids below ``root`` in a ``pid -> parent pid`` table."""
    children: dict[int, list[int]] = defaultdict(list)
    for pid, parent in parents.items():
        children[parent].append(pid)
    found, pending = set(), [root]
    while pending:
        for child in children[pending.pop()]:
            found.add(child)
            pending.append(child)
    return found


def cpu_used(start: Sample, end: Sample) -> float:
    """CPU seconds between two samples. A descendant alive at the start and reaped by the
    end is in the reaped total with its whole life: what it had used before is taken off."""
    live = sum(seconds - start.live.get(pid, 0.0) for pid, seconds in end.live.items())
    reaped_before = sum(seconds for pid, seconds in start.live.items() if pid not in end.live)
    return (end.own - start.own) + (end.reaped - start.reaped - reaped_before) + live


def _processes() -> dict[int, tuple[int, float]]:
    """``pid -> (parent, CPU seconds)`` from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # After the command's closing parenthesis: state, parent, ...; then from the
            # 12th field utime, stime and the same two of the children it has reaped (a
            # scheduler's of its tasks' processes), as RUSAGE_CHILDREN counts them for us.
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        found[int(entry.name)] = (int(fields[1]), sum(map(int, fields[11:15])) / TICKS_PER_SECOND)
    return found


def sample() -> Sample:
    processes = _processes()
    below = descendants({pid: parent for pid, (parent, _) in processes.items()}, os.getpid())
    own, reaped = (resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return Sample(
        own.ru_utime + own.ru_stime,
        reaped.ru_utime + reaped.ru_stime,
        {pid: processes[pid][1] for pid in below},
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    prefix = os.environ.get(REPORT_VARIABLE)
    if not prefix:
        yield
        return
    start, started = sample(), time.monotonic()
    yield
    row = {"test": item.nodeid, "wall_s": time.monotonic() - started, "cpu_s": cpu_used(start, sample())}
    with open(f"{prefix}.{os.getpid()}.jsonl", "a") as report:  # one file per xdist worker
        report.write(json.dumps(row) + "\n")


def summary(rows: Iterable[Mapping], top: int = 30) -> str:
    """The totals, then the files and the tests that used the most CPU."""
    rows = list(rows)
    by_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for row in rows:
        totals = by_file[row["test"].split("::")[0]]
        totals[0] += row["cpu_s"]
        totals[1] += row["wall_s"]
        totals[2] += 1
    cpu, wall = sum(row["cpu_s"] for row in rows), sum(row["wall_s"] for row in rows)
    lines = [
        f"{len(rows)} tests: {cpu:.0f} CPU-s over {wall:.0f} s of tests",
        "",
        "  CPU-s  wall-s  tests  file",
    ]
    ranked = sorted(by_file.items(), key=lambda item: -item[1][0])[:top]
    lines += [f"{c:7.0f} {w:7.0f} {n:6d}  {name}" for name, (c, w, n) in ranked]
    lines += ["", "  CPU-s  wall-s  test"]
    lines += [
        f"{row['cpu_s']:7.1f} {row['wall_s']:7.1f}  {row['test']}"
        for row in sorted(rows, key=lambda row: -row["cpu_s"])[:top]
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    [prefix] = argv
    folder, stem = Path(prefix).parent, Path(prefix).name
    reports = sorted(folder.glob(f"{stem}.*.jsonl"))
    rows = [json.loads(line) for path in reports for line in path.read_text().splitlines()]
    print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
