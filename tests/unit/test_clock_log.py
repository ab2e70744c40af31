"""The rule that reads the pipeline clock back from the ``ops.watermarks`` snapshot
and the history steps since it (``spark_jobs.eventtime.clock_log``), on literal rows."""

from __future__ import annotations

from spark_jobs.eventtime.clock import MAX_WATERMARK
from spark_jobs.eventtime.clock_log import clock_state
from spark_jobs.eventtime.tracker import PartitionSnapshot


def clock(partition: str, watermark: int, idle: bool = False) -> dict:
    return {
        "source_partition": partition,
        "max_event_ms": watermark + 1,
        "partition_watermark": watermark,
        "last_data_ms": 500,
        "is_idle": idle,
        "is_aligned": True,
    }


def snapshot_row(batch_id: int, partition: str, watermark: int, idle: bool = False) -> dict:
    return {**clock(partition, watermark, idle), "batch_id": batch_id}


def step(batch_id: int, watermark: int, processing_ms: int, clocks: list[dict] | None = None) -> dict:
    return {
        "batch_id": batch_id,
        "watermark": watermark,
        "processing_ms": processing_ms,
        "partition_clocks": clocks,
    }


def partition(name: str, watermark: int, idle: bool = False) -> PartitionSnapshot:
    return PartitionSnapshot(name, watermark + 1, watermark, 500, idle, True)


def test_a_new_lakehouse_has_no_judged_version_no_watermark_and_no_partitions():
    state = clock_state([], [])
    assert (state.judged_version, state.watermark, state.partitions) == (None, None, ())
    assert state.last_step_batch is None
    assert not state.snapshot_stale


def test_without_clocked_steps_the_snapshot_is_the_clock():
    snapshot = [snapshot_row(3, "1", 90), snapshot_row(3, "0", 100)]
    state = clock_state(snapshot, [step(3, 90, 1_000)])
    assert state.judged_version == 3
    assert state.partitions == (partition("0", 100), partition("1", 90))
    assert state.watermark == 90
    assert not state.snapshot_stale


def test_a_step_recorded_after_the_snapshot_holds_the_clock_and_makes_the_snapshot_stale():
    snapshot = [snapshot_row(3, "0", 100)]
    steps = [
        step(3, 100, 1_000, [clock("0", 100)]),
        step(4, 150, 2_000),
        step(5, 200, 3_000, [clock("0", 200)]),
    ]
    state = clock_state(snapshot, steps)
    assert state.judged_version == 5
    assert state.partitions == (partition("0", 200),)
    assert state.watermark == 200
    assert state.snapshot_stale


def test_an_idleness_step_on_the_judged_version_wins_by_its_later_processing_time():
    snapshot = [snapshot_row(5, "0", 200)]
    steps = [step(5, 200, 3_000, [clock("0", 200)]), step(5, 200, 9_000, [clock("0", 200, idle=True)])]
    state = clock_state(snapshot, steps)
    assert state.judged_version == 5
    assert state.partitions == (partition("0", 200, idle=True),)
    assert state.snapshot_stale


def test_an_idleness_step_planned_before_a_later_batch_never_wins_over_it():
    # Planned on version 5, committed after the batch that judged version 6.
    steps = [step(6, 300, 4_000, [clock("0", 300)]), step(5, 200, 9_000, [clock("0", 200, idle=True)])]
    state = clock_state([], steps)
    assert state.judged_version == 6
    assert state.partitions == (partition("0", 300),)
    assert state.watermark == 300


def test_the_end_of_input_recorded_beyond_the_judged_version_is_the_watermark():
    steps = [step(5, 200, 3_000, [clock("0", 200)]), step(6, MAX_WATERMARK, 9_000)]
    state = clock_state([], steps)
    assert state.judged_version == 5
    assert state.watermark == MAX_WATERMARK
    assert state.last_step_batch == 6


def test_steps_beyond_the_judged_version_without_clocks_are_not_part_of_the_clock():
    # Written before the clocks moved into the history: a batch that died before its clocks.
    snapshot = [snapshot_row(5, "0", 200)]
    state = clock_state(snapshot, [step(5, 200, 3_000), step(6, 400, 4_000)])
    assert state.judged_version == 5
    assert state.watermark == 200
    assert state.last_step_batch == 6


def test_a_snapshot_of_the_same_clocks_at_another_version_is_stale():
    snapshot = [snapshot_row(4, "0", 200)]
    state = clock_state(snapshot, [step(5, 200, 3_000, [clock("0", 200)])])
    assert state.partitions == (partition("0", 200),)
    assert state.snapshot_stale


def test_a_snapshot_equal_to_the_newest_clocked_step_is_not_stale():
    snapshot = [snapshot_row(5, "0", 200)]
    state = clock_state(snapshot, [step(5, 200, 3_000, [clock("0", 200)])])
    assert not state.snapshot_stale
