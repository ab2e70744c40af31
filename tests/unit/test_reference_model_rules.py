"""The reference model's rules beyond the seed examples: edge cases and invariants."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.eventtime import MAX_WATERMARK, MIN_WATERMARK, Batch, Record, Window, run_reference
from tests.unit.model_helpers import SECOND, one_per_batch, rules, sensor


def test_sliding_window_lateness_is_per_window_and_each_missed_pair_is_quarantined():
    # size 10 s, slide 5 s: ts=7 belongs to [0,10) and [5,15).
    stream = [sensor(1), sensor(11), sensor(7)]  # ts=11 -> watermark 10999 cleans [0,10) only
    result = run_reference(rules("monotonous", size_s=10, slide_s=5), one_per_batch(stream))

    assert [(q.record.timestamp, q.window) for q in result.quarantined] == [
        (7 * SECOND, Window(0, 10 * SECOND))
    ]
    assert result.windows[(("s1",), Window(5 * SECOND, 15 * SECOND))].record_count == 2  # 7 and 11


def test_several_late_records_in_one_batch_refire_the_window_once():
    batches = [Batch([sensor(1)]), Batch([sensor(12)]), Batch([sensor(3), sensor(4)])]
    result = run_reference(rules("bounded", bound_s=2, lateness_s=5), batches)

    assert [(f.revision, f.record_count) for f in result.firings] == [(1, 1), (2, 3)]


def test_records_of_a_batch_are_judged_against_the_watermark_at_batch_start():
    # 15 would clean [0,10) if it counted first; judged at batch start the 2 is on time.
    result = run_reference(rules("monotonous"), [Batch([sensor(1)]), Batch([sensor(15), sensor(2)])])

    assert result.quarantined == []
    assert result.windows[(("s1",), Window(0, 10 * SECOND))].record_count == 2


def test_a_reactivated_partition_behind_the_watermark_has_its_records_judged_late():
    batches = [
        Batch([sensor(1, partition=1), sensor(1, partition=2)], processing_time=0),
        Batch([sensor(30, partition=1)], processing_time=10 * SECOND),  # partition 2 idle
        Batch([sensor(2, partition=2)], processing_time=11 * SECOND),  # back, far behind
    ]
    result = run_reference(rules("monotonous", idleness_s=5), batches)

    assert result.watermarks[1] == 30 * SECOND - 1
    assert [q.record.timestamp for q in result.quarantined] == [2 * SECOND]
    assert result.watermarks[2] == 30 * SECOND - 1  # neither pulled back nor held


def test_punctuated_markers_advance_the_watermark_and_are_not_data():
    marker = Record(0, 10 * SECOND, {"id": "s1"}, marker=True)
    result = run_reference(rules("punctuated"), [Batch([sensor(3), sensor(50)]), Batch([marker])])

    assert result.watermarks == [-(2**63), 10 * SECOND]
    [firing] = result.firings
    assert (firing.window, firing.record_count) == (Window(0, 10 * SECOND), 1)
    assert sum(entry.on_time_count for entry in result.history) == 2


def test_flush_moves_the_watermark_to_infinity_and_closes_every_window():
    result = run_reference(
        rules("bounded", bound_s=60, lateness_s=5), [Batch([sensor(1), sensor(25)])], flush=True
    )

    assert result.watermarks[-1] == MAX_WATERMARK
    assert {w.status for w in result.windows.values()} == {"closed"}
    assert {w.revision for w in result.windows.values()} == {1}


def test_a_batch_with_no_data_still_fires_windows_when_a_partition_goes_idle():
    batches = [Batch([sensor(1, 1), sensor(12, 2)], processing_time=0), Batch([], processing_time=SECOND)]
    result = run_reference(rules("monotonous", idleness_s=1), batches)

    assert [f.batch for f in result.firings] == [1]


# --- invariants on random streams -------------------------------------------------

arrivals = st.lists(
    st.tuples(st.integers(0, 2), st.integers(-30, 90)),  # (partition, seconds)
    max_size=40,
)


def cut(records, cuts):
    bounds = sorted({0, len(records), *(c % (len(records) + 1) for c in cuts)})
    return [
        Batch(records[a:b], processing_time=i * SECOND) for i, (a, b) in enumerate(itertools.pairwise(bounds))
    ]


@settings(max_examples=200, deadline=None)
@given(arrivals, st.lists(st.integers(0, 100), max_size=10), st.booleans(), st.integers(0, 20))
def test_every_record_window_pair_is_counted_exactly_once(stream, cuts, sliding, lateness):
    records = [sensor(s, p) for p, s in stream]
    spec = rules("bounded", bound_s=3, lateness_s=lateness, slide_s=5 if sliding else None, idleness_s=2)
    result = run_reference(spec, cut(records, cuts), flush=True)

    pairs = sum(len(spec.window.assign(r.timestamp)) for r in records)
    counted = sum(w.record_count for w in result.windows.values())
    assert counted + len(result.quarantined) == pairs
    assert sum(h.on_time_count for h in result.history) == counted
    assert sum(h.late_count for h in result.history) == len(result.quarantined)
    assert result.watermarks == sorted(result.watermarks)


@st.composite
def bounded_partition_streams(draw, bound_s=5):
    """Per partition, each timestamp is at most ``bound_s`` behind the partition's max so far."""
    streams = []
    for partition in range(3):
        current, stream = draw(st.integers(0, 20)), []
        for _ in range(draw(st.integers(0, 15))):
            current += draw(st.integers(0, 8))
            stream.append(sensor(current - draw(st.integers(0, bound_s)), partition, key=f"k{partition % 2}"))
        streams.append(stream)
    return streams


def interleave(streams, choices):
    queues, merged, i = [list(s) for s in streams], [], 0
    while any(queues):
        live = [q for q in queues if q]
        merged.append(live[choices[i % len(choices)] % len(live)].pop(0) if choices else live[0].pop(0))
        i += 1
    return merged


@settings(max_examples=150, deadline=None)
@given(
    bounded_partition_streams(),
    st.lists(st.integers(0, 9), max_size=30),
    st.lists(st.integers(0, 100), max_size=10),
)
def test_any_interleaving_and_batching_gives_the_same_windows_when_partitions_respect_the_bound(
    streams, choices, cuts
):
    spec = rules("bounded", bound_s=5, lateness_s=0, partitions=(0, 1, 2))
    live = run_reference(
        spec, one_per_batch([r for s in streams for r in s]), flush=True
    )  # one partition at a time
    replay = run_reference(spec, cut(interleave(streams, choices), cuts), flush=True)

    def contents(result):
        return {slot: (w.record_count, w.measures, w.revision) for slot, w in result.windows.items()}

    assert replay.quarantined == [] and live.quarantined == []
    assert contents(replay) == contents(live)


def test_a_partition_the_source_reports_before_its_first_record_holds_the_watermark():
    # Partition 2 is added to the topic with batch 1 and sends its old record in batch 2.
    batches = [
        Batch([sensor(5, partition=1)]),
        Batch([sensor(30, partition=1)], partitions=frozenset({1, 2})),
        Batch([sensor(6, partition=2)]),
    ]
    result = run_reference(rules("monotonous"), batches)

    assert result.watermarks[1] == result.watermarks[0] == 5 * SECOND - 1
    assert result.quarantined == []


def test_a_partition_reported_without_data_goes_idle_like_any_other_when_it_has_no_backlog():
    batches = [
        Batch([sensor(5, partition=1)], processing_time=0, partitions=frozenset({1, 2})),
        Batch([sensor(30, partition=1)], processing_time=10 * SECOND),
    ]
    result = run_reference(rules("monotonous", idleness_s=1), batches)

    assert result.watermarks == [MIN_WATERMARK, 30 * SECOND - 1]
