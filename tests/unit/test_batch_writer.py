"""Which micro-batches a job's writer may take for new without reading the log:
only one right after a batch it completed itself."""

import pytest

from spark_jobs.jobs.common import BatchWriter
from spark_jobs.lakehouse.runs import RunTotals


class Writer(BatchWriter):
    def __init__(self, failing: set[int] = frozenset()) -> None:
        super().__init__(None, None, RunTotals())
        self.failing = failing

    def write_batch(self, batch, batch_id: int) -> None:
        if batch_id in self.failing:
            raise RuntimeError(f"batch {batch_id} failed")


def test_a_writers_first_batch_is_never_taken_for_new():
    assert not Writer().follows_completed(0)
    assert not Writer().follows_completed(7)


def test_the_batch_right_after_a_completed_one_is_new():
    writer = Writer()
    writer(None, 4)
    assert writer.follows_completed(5)


def test_a_batch_replayed_under_its_own_id_is_not_new():
    writer = Writer()
    writer(None, 4)
    assert not writer.follows_completed(4)


def test_after_a_failed_batch_no_batch_is_taken_for_new():
    writer = Writer(failing={5})
    writer(None, 4)
    with pytest.raises(RuntimeError):
        writer(None, 5)
    assert not writer.follows_completed(5)
    assert not writer.follows_completed(6)
