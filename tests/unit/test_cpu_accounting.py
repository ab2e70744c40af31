"""The suite's CPU accounting tool (tests/tools/cpu_accounting.py)."""

from __future__ import annotations

import subprocess
import sys

from tests.tools.cpu_accounting import Sample, cpu_used, descendants, sample, summary


def test_descendants_are_every_pid_below_the_root_and_nothing_beside_it():
    parents = {10: 1, 11: 10, 12: 11, 13: 10, 20: 1, 21: 20}
    assert descendants(parents, 10) == {11, 12, 13}
    assert descendants(parents, 12) == set()


def test_a_process_started_during_the_test_counts_whole():
    start = Sample(own=1.0, reaped=0.0, live={})
    end = Sample(own=1.5, reaped=0.0, live={7: 4.0})
    assert cpu_used(start, end) == 4.5


def test_a_process_alive_before_counts_only_what_it_used_during_the_test():
    start = Sample(own=0.0, reaped=0.0, live={7: 30.0})
    end = Sample(own=0.0, reaped=0.0, live={7: 32.5})
    assert cpu_used(start, end) == 2.5


def test_a_process_reaped_during_the_test_counts_only_what_it_used_during_the_test():
    # Reaped, its whole life (30 + 2 s) moved to the reaped total.
    start = Sample(own=0.0, reaped=5.0, live={7: 30.0})
    end = Sample(own=0.0, reaped=37.0, live={})
    assert cpu_used(start, end) == 2.0


def test_a_child_that_ran_to_its_end_is_counted():
    start = sample()
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)
    assert cpu_used(start, sample()) > 0.1


def test_the_summary_ranks_files_and_tests_by_cpu():
    rows = [
        {"test": "tests/a.py::cheap", "cpu_s": 1.0, "wall_s": 9.0},
        {"test": "tests/b.py::dear", "cpu_s": 50.0, "wall_s": 60.0},
        {"test": "tests/a.py::middling", "cpu_s": 20.0, "wall_s": 21.0},
    ]
    lines = summary(rows).splitlines()
    assert lines[0] == "3 tests: 71 CPU-s over 90 s of tests"
    files = [line.split()[-1] for line in lines[3:5]]
    assert files == ["tests/b.py", "tests/a.py"]
    tests = [line.split()[-1] for line in lines[-3:]]
    assert tests == ["tests/b.py::dear", "tests/a.py::middling", "tests/a.py::cheap"]
