"""The shared watermark tracker (generators and valve, used by the engine and the
reference model alike) against the naive implementation in ``naive_watermarks``,
on random streams that draw every strategy, punctuated markers, idleness,
partitions declared before their records, backlogs and quiet stretches."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from spark_jobs.eventtime.generators import WatermarkSpec
from spark_jobs.eventtime.tracker import PartitionInput, WatermarkTracker
from tests.unit.naive_watermarks import Batch, Rules, clocks

PARTITIONS = (0, 1, 2, 3)


def sends(strategy: str) -> st.SearchStrategy[tuple[int | None, int | None]]:
    """What one partition sends in a batch: its largest data timestamp and largest
    marker. Only punctuated sources carry markers; a batch may hold only markers."""
    timestamps = st.integers(-50, 200)
    if strategy != "punctuated":
        return st.tuples(timestamps, st.none())
    return st.tuples(st.none() | timestamps, st.none() | timestamps).filter(lambda sent: sent != (None, None))


@st.composite
def streams(draw) -> tuple[Rules, list[Batch]]:
    strategy = draw(st.sampled_from(["bounded", "monotonous", "punctuated"]))
    rules = Rules(strategy, draw(st.integers(0, 20)), draw(st.none() | st.integers(0, 6)))
    now, batches = 0, []
    for _ in range(draw(st.integers(1, 12))):
        now += draw(st.integers(0, 4))  # quiet stretches long enough to go idle, or not
        partitions = st.sampled_from(PARTITIONS)
        sent = draw(st.dictionaries(partitions, sends(strategy), max_size=4))
        declared = frozenset(draw(st.sets(partitions, max_size=2)))
        backlog = frozenset(draw(st.sets(partitions, max_size=2)))
        batches.append(Batch(now, sent, declared, backlog))
    return rules, batches


def tracked(rules: Rules, batches: list[Batch]) -> list[tuple[int, dict]]:
    """The shared tracker's combined watermark and partition clocks after each batch,
    driven as the silver job drives it (declare the reported partitions, then advance)."""
    tracker = WatermarkTracker(WatermarkSpec(rules.strategy, rules.bound_ms, rules.idleness_ms))
    states = []
    for batch in batches:
        tracker.declare(sorted(batch.declared), batch.now)
        inputs = {partition: PartitionInput(*sent) for partition, sent in sorted(batch.sent.items())}
        tracker.advance(batch.now, inputs, batch.backlog)
        partitions = {
            snapshot.partition: (snapshot.watermark, snapshot.is_idle, snapshot.is_aligned)
            for snapshot in tracker.snapshots()
        }
        states.append((tracker.watermark, partitions))
    return states


def naive(rules: Rules, batches: list[Batch]) -> list[tuple[int, dict]]:
    states = []
    for end in range(1, len(batches) + 1):
        watermark, partitions = clocks(rules, batches[:end])
        states.append((watermark, {p: (c.watermark, c.is_idle, c.is_aligned) for p, c in partitions.items()}))
    return states


@settings(max_examples=400, deadline=None)
@given(streams())
# Partition 1 goes idle, the watermark moves past it, and it comes back behind: it
# must not hold the minimum again until its own watermark catches up.
@example(
    (
        Rules("bounded", 0, 2),
        [
            Batch(0, {0: (10, None), 1: (5, None)}),
            Batch(3, {0: (30, None)}),
            Batch(4, {1: (8, None)}),
            Batch(5, {1: (40, None), 0: (35, None)}),
        ],
    )
)
def test_the_shared_tracker_equals_the_naive_rules_on_random_streams(stream):
    rules, batches = stream
    assert tracked(rules, batches) == naive(rules, batches)


def test_a_punctuated_partition_that_sends_only_data_holds_the_minimum_at_its_last_marker():
    rules = Rules("punctuated", 0, None)
    batches = [Batch(0, {0: (None, 50), 1: (None, 20)}), Batch(1, {1: (90, None)})]
    assert [watermark for watermark, _ in naive(rules, batches)] == [20, 20]
    assert tracked(rules, batches) == naive(rules, batches)
