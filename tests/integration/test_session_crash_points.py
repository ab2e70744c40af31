"""The crash-point matrix for session windows: bronze, silver's sessions, gold's
rollup of them, the idleness step, the end of input and the late merge, each crashed
right after each of its writes and run again (as ``test_crash_points`` does for
windows); every table must then hold what a run without a crash holds."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.integration.engine import BASE_MS
from tests.integration.test_crash_points import MERGE_WRITES, SILVER_WRITES, STEP_WRITES, scenario

pytestmark = [pytest.mark.spark, pytest.mark.slow]

WINDOW = {"type": "session", "gap": "3s"}


# The session path's writes: the live sessions (``silver:windows``), their quarantine,
# the idleness step's and the end of input's firings, gold's rollup and the late merge
# that folds the quarantined record into its key's closed session.
SESSION_PLAN = {
    0: ["bronze:bronze", *SILVER_WRITES, "gold:gold"],
    1: ["bronze:rejects", "silver:windows", "silver:quarantine", *SILVER_WRITES[1:], "gold:gold"],
    "end": [*STEP_WRITES, *MERGE_WRITES],
}


def test_a_crash_right_after_any_session_write_then_a_restart_leaves_the_tables_of_a_run_without_crashes(
    spark, tmp_path, monkeypatch
):
    uncrashed = scenario(spark, tmp_path / "uncrashed", monkeypatch, {}, window=WINDOW)
    # The scenario means what it says: 2 s touches d0's closed [3 s, 6 s) and is
    # quarantined, then merged into it; the other sessions close at the end of input.
    assert [(row[1] - BASE_MS, row[-1]) for row in uncrashed["quarantine"]] == [(2_000, "merged")]
    statuses = Counter(row[-3] for row in uncrashed["silver"].elements())
    assert statuses == Counter({"closed": 6})

    crashed = scenario(spark, tmp_path / "crashed", monkeypatch, SESSION_PLAN, window=WINDOW)

    for table, rows in uncrashed.items():
        assert crashed[table] == rows, f"{table} differs after the crashes"
