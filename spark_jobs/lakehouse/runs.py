"""``ops.runs``, the run log: every job run's start and end, as blind appends."""

from __future__ import annotations

import sys
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pyspark.sql import SparkSession

from spark_jobs.faults import crash_point
from spark_jobs.jvm import error_summary
from spark_jobs.lakehouse.transaction import Transaction
from spark_jobs.tables import TableRegistry


@dataclass
class RunTotals:
    batches: int = 0
    rows_in: int = 0
    rows_out: int = 0
    late: int = 0
    rejected: int = 0


@dataclass
class RunLog:
    """``ops.runs``: a ``running`` row when a job starts and a final row when it ends.

    Both are blind appends, which never conflict with other writers; a run killed
    with SIGKILL keeps only its ``running`` row. The latest row per ``run_id`` is
    the run's state."""

    spark: SparkSession
    job: str
    registry: TableRegistry
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    _starting: threading.Thread | None = field(default=None, init=False, repr=False)

    def _append(self, status: str, totals: RunTotals, message: str | None, ended: datetime | None) -> None:
        duration = None if ended is None else int((ended - self.started_at).total_seconds() * 1000)
        row = (
            self.run_id,
            self.job,
            self.registry.config.name,
            status,
            totals.batches,
            totals.rows_in,
            totals.rows_out,
            totals.late,
            totals.rejected,
            self.started_at,
            ended,
            duration,
            message,
        )
        table = self.registry.ops["runs"]
        # Written from the driver, without a Spark job, and through no session
        # setting: the running row is appended while the job's first micro-batch may
        # hold Delta txn settings on the job's session.
        txn = Transaction(self.spark, table.path)
        txn.commit_append(txn.write_rows([row], table.schema), f"tidemark-run:{self.run_id}:{status}")

    def started(self) -> None:
        """Append the ``running`` row beside the job's start-up, which need not wait
        for a Delta commit; :meth:`ended` waits for it, so the final row always follows
        it."""
        self._starting = threading.Thread(target=self._log_start, name=f"tidemark-run-log-{self.job}")
        self._starting.start()

    def _log_start(self) -> None:
        # The job goes on without its running row (a full disk fails this first): the
        # final row, or the job's own error, tells what happened.
        try:
            self._append("running", RunTotals(), None, None)
        except Exception as error:
            unlogged = f"could not log the run's start: {error_summary(error)}"
            print(f"tidemark {self.job}: {unlogged}", file=sys.stderr)
        else:
            crash_point(f"{self.job}:started")

    def ended(self, status: str, totals: RunTotals, message: str | None = None) -> None:
        if self._starting is not None:
            self._starting.join()
        self._append(status, totals, message, datetime.now(UTC))
