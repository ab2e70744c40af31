"""``judging.late_pairs_possible``: a silver batch judges its pairs one by one only
when one of them can be late. Checked on literal batches and, against a naive
search over every (record, window) pair, on random ones."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from spark_jobs.engine.judging import Summary, late_pairs_possible
from spark_jobs.eventtime.generators import PartitionInput
from spark_jobs.eventtime.windows import WindowSpec, is_cleaned

MINUTE = 60_000
TUMBLING = WindowSpec.tumbling(MINUTE)
SLIDING = WindowSpec.sliding(MINUTE, 20_000)


def version(number: int, timestamps: list[int]) -> Summary:
    """A version's summary row, as silver's summary pass makes it."""
    earliest = min(timestamps) if timestamps else None
    return Summary(number, "0", PartitionInput(max(timestamps, default=None)), 0, len(timestamps), earliest)


def test_a_record_whose_window_was_cleaned_when_its_version_began_can_be_late():
    # The first minute's window is cleaned at watermark 59_999 + 10_000 (lateness 10 s).
    assert late_pairs_possible([version(1, [5_000, 70_000])], {1: 69_999}, TUMBLING, 10_000)


def test_records_whose_windows_are_all_within_lateness_cannot_be_late():
    assert not late_pairs_possible([version(1, [5_000, 70_000])], {1: 69_998}, TUMBLING, 10_000)


def test_each_version_is_judged_against_its_own_starting_watermark():
    batch = [version(1, [5_000]), version(2, [65_000])]

    assert not late_pairs_possible(batch, {1: 0, 2: 69_999}, TUMBLING, 10_000)
    assert late_pairs_possible(batch, {1: 69_999, 2: 69_999}, TUMBLING, 10_000)


def test_a_sliding_records_earliest_window_decides_though_its_latest_is_open():
    # 45_000 lies in [0, 60_000), [20_000, 80_000) and [40_000, 100_000).
    assert late_pairs_possible([version(1, [45_000])], {1: 59_999}, SLIDING, 0)


def test_a_version_of_markers_only_cannot_be_late():
    assert not late_pairs_possible([version(1, [])], {1: 10**12}, TUMBLING, 0)


def naive(batches: dict[int, list[int]], watermarks: dict[int, int], spec: WindowSpec, lateness: int) -> bool:
    return any(
        is_cleaned(window, watermarks[number], lateness)
        for number, timestamps in batches.items()
        for timestamp in timestamps
        for window in spec.assign(timestamp)
    )


specs = st.builds(
    lambda size, slide_share, offset: WindowSpec(size, max(1, size * slide_share // 4), offset % size),
    st.integers(1, 120_000),
    st.integers(1, 4),
    st.integers(0, 120_000),
)
batches = st.dictionaries(st.integers(0, 5), st.lists(st.integers(-300_000, 300_000), max_size=6), min_size=1)


@given(batches, specs, st.integers(0, 60_000), st.data())
def test_it_agrees_with_a_search_over_every_pair(batches, spec, lateness, data):
    watermarks = {number: data.draw(st.integers(-400_000, 400_000)) for number in batches}
    summary = [version(number, timestamps) for number, timestamps in batches.items()]

    expected = naive(batches, watermarks, spec, lateness)
    assert late_pairs_possible(summary, watermarks, spec, lateness) == expected
