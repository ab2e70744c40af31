"""Watermark generators as a user writes them (``strategy: custom``), for the tests.
None of them is part of Tidemark: they plug in through the pipeline file's
``generator: "tests.unit.user_generators:Class"``."""

from __future__ import annotations

from typing import Any

from spark_jobs.eventtime.generators import BatchSummary


def newest(batch: BatchSummary) -> int | None:
    return max((t for t in (batch.running_max, batch.max_timestamp) if t is not None), default=None)


class MedianDisorder:
    """Stateless: the partition's newest event time, less the batch's median lag
    behind it (nothing before any lag was seen), less 1 ms."""

    def on_batch(self, batch: BatchSummary) -> int | None:
        top = newest(batch)
        return None if top is None else top - batch.disorder.get(0.5, 0) - 1


class ShrinkingBound:
    """Stateful: a bound of ``start`` ms that shrinks by ``step`` with every batch the
    partition sends, down to 0. Its state must survive a restart, or a restarted
    stream would start over at ``start``."""

    def __init__(self, start: int = 10_000, step: int = 2_000) -> None:
        self.bound, self.step = start, step

    def on_batch(self, batch: BatchSummary) -> int | None:
        bound, self.bound = self.bound, max(0, self.bound - self.step)
        top = newest(batch)
        return None if top is None else top - bound - 1

    def snapshot(self) -> dict[str, Any]:
        return {"bound": self.bound}

    def restore(self, state: dict[str, Any]) -> None:
        self.bound = state["bound"]


class Recording:
    """Keeps every summary it is given; returns the candidates it is told to."""

    def __init__(self, answers: tuple = ()) -> None:
        self.seen: list[BatchSummary] = []
        self.answers = list(answers)

    def on_batch(self, batch: BatchSummary) -> Any:
        self.seen.append(batch)
        return self.answers.pop(0) if self.answers else None


class NoOnBatch:
    def emit(self) -> int:
        return 0


class OnBatchWithoutArgument:
    def on_batch(self) -> int:
        return 0


class SnapshotWithoutRestore:
    def on_batch(self, batch: BatchSummary) -> int | None:
        return None

    def snapshot(self) -> dict:
        return {}


class UnserializableState:
    def on_batch(self, batch: BatchSummary) -> int | None:
        return None

    def snapshot(self) -> object:
        return object()

    def restore(self, state: Any) -> None:
        pass


class NeedsAnOption:
    def __init__(self, bound_ms: int) -> None:
        self.bound_ms = bound_ms

    def on_batch(self, batch: BatchSummary) -> int | None:
        top = newest(batch)
        return None if top is None else top - self.bound_ms - 1


class FailsToBuild:
    def __init__(self) -> None:
        raise ValueError("no")


class FailsOnBatch:
    def on_batch(self, batch: BatchSummary) -> int | None:
        return {}["missing"]


class TupleState:
    def on_batch(self, batch: BatchSummary) -> int | None:
        return None

    def snapshot(self) -> tuple:
        return (1, 2)

    def restore(self, state: Any) -> None:
        pass
