"""Seed 000's worked examples, replayed through the reference model.

Where the article rounds, Flink's code subtracts 1 ms from every bounded
watermark (max_ts - bound - 1): these tests expect Flink's values.
"""

from spark_jobs.eventtime import MIN_WATERMARK, Batch, Window, run_reference
from tests.unit.model_helpers import SECOND, one_per_batch, rules, sensor

W_0_10 = Window(0, 10 * SECOND)
W_10_20 = Window(10 * SECOND, 20 * SECOND)


def contents(firing):
    return (firing.window, firing.revision, firing.record_count, firing.measures["vc_sum"])


def test_monotonous_tumbling_window_fires_when_a_record_reaches_its_end():
    result = run_reference(rules("monotonous"), one_per_batch(map(sensor, [1, 2, 3, 5, 9, 10, 20])))

    # ts=10 makes the watermark 9999 = end - 1 of [0,10): it fires with 1,2,3,5,9.
    assert [(f.batch, *contents(f)) for f in result.firings] == [
        (5, W_0_10, 1, 5, 1 + 2 + 3 + 5 + 9),
        (6, W_10_20, 1, 1, 10),
    ]
    assert result.watermarks[5] == 10 * SECOND - 1


def test_bounded_out_of_orderness_waits_two_seconds_and_takes_the_straggler():
    stream = [1, 2, 5, 7, 9, 10, 3, 11, 12]
    result = run_reference(rules("bounded", bound_s=2), one_per_batch(map(sensor, stream)), flush=True)

    first, second = result.firings
    # Not at ts=10 (watermark 7999) nor 11, but at 12: 12000 - 2000 - 1 = 9999.
    assert first.batch == 8 and contents(first) == (W_0_10, 1, 6, 1 + 2 + 5 + 7 + 9 + 3)
    # [10,20) only fires when the input ends (the article's socket closing).
    assert second.batch == 9 and contents(second) == (W_10_20, 1, 3, 10 + 11 + 12)
    assert result.quarantined == []


def test_allowed_lateness_refires_the_window_then_side_outputs_after_cleanup():
    stream = [1, 2, 10, 12, 6, 3, 14, 5, 3]
    result = run_reference(
        rules("bounded", bound_s=2, lateness_s=2), one_per_batch(map(sensor, stream)), flush=True
    )

    assert [contents(f) for f in result.firings if f.window == W_0_10] == [
        (W_0_10, 1, 2, 1 + 2),
        (W_0_10, 2, 3, 1 + 2 + 6),
        (W_0_10, 3, 4, 1 + 2 + 6 + 3),
    ]
    # ts=14 -> watermark 11999 = end - 1 + lateness: [0,10) is cleaned; 5 and 3 go to the side output.
    assert [(q.record.timestamp, q.window, q.watermark, q.lateness_ms) for q in result.quarantined] == [
        (5 * SECOND, W_0_10, 11_999, 6_999),
        (3 * SECOND, W_0_10, 11_999, 8_999),
    ]
    final = result.windows[(("s1",), W_0_10)]
    assert (final.record_count, final.revision, final.status) == (4, 3, "closed")
    assert result.windows[(("s1",), W_10_20)].record_count == 3


def test_side_output_receives_records_for_cleaned_windows():
    stream = [1, 2, 12, 5, 7, 14, 1, 2]
    result = run_reference(rules("bounded", bound_s=2, lateness_s=2), one_per_batch(map(sensor, stream)))

    assert [f.record_count for f in result.firings if f.window == W_0_10] == [2, 3, 4]
    assert [q.record.timestamp for q in result.quarantined] == [1 * SECOND, 2 * SECOND]


def test_parallel_partitions_combine_by_minimum():
    # Both upstream channels exist from the start (declared), as in the article's job.
    # Article table (delay 3 s): -, -2, 0, 2, 4, 10 seconds; Flink: minus 1 ms more.
    arrivals = [(1, 1), (2, 3), (1, 5), (2, 7), (1, 13), (2, 14)]
    result = run_reference(
        rules("bounded", bound_s=3, partitions=(1, 2)), one_per_batch(sensor(s, p) for p, s in arrivals)
    )

    assert result.watermarks == [MIN_WATERMARK] + [s * SECOND - 1 for s in (-2, 0, 2, 4, 10)]


def test_without_idleness_a_silent_partition_holds_the_watermark_back():
    arrivals = [(1, 1), (2, 2), (1, 3), (1, 5), (1, 7), (1, 13)]
    result = run_reference(
        rules("bounded", bound_s=3, partitions=(1, 2)), one_per_batch(sensor(s, p) for p, s in arrivals)
    )

    # Article: -, -2, -1, then stuck at -1 while only map1 sends data.
    assert result.watermarks == [MIN_WATERMARK, -2001, -1001, -1001, -1001, -1001]


def test_idleness_excludes_the_silent_partition_after_the_timeout():
    arrivals = [(1, 1), (2, 2), (1, 3), (1, 5), (1, 7)]
    batches = one_per_batch(sensor(s, p) for p, s in arrivals)  # processing times 0..4 s
    # The idleness check runs at 6 s (no data): partition 2 is quiet for 5 s >= idleness.
    batches.append(Batch([], processing_time=6 * SECOND))
    result = run_reference(rules("bounded", bound_s=3, idleness_s=5, partitions=(1, 2)), batches)

    assert result.watermarks[:5] == [MIN_WATERMARK, -2001, -1001, -1001, -1001]
    assert result.watermarks[5] == 7 * SECOND - 3 * SECOND - 1
    last = result.history[5]
    assert (last.active_partitions, last.idle_partitions) == (1, 1)
