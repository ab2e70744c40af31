"""``tidemark tune`` for sessions without Spark: the sessions of all a key's records at
once, from its runs, against the naive rule; a session's first firing as delays."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from spark_jobs.engine.session_store import Unit
from spark_jobs.engine.session_tuning import first_firing, whole_sessions
from tests.unit.test_session_model import naive_sessions

spans = st.lists(
    st.tuples(st.integers(0, 200), st.integers(1, 30), st.integers(1, 4)), min_size=1, max_size=12
)


@given(spans)
def test_runs_fall_in_the_sessions_the_naive_rule_makes_of_their_spans(found):
    units = [
        Unit(
            version=index % 3,
            run=index,
            start_ms=start,
            end_ms=start + length,
            records=records,
            first_member=0,
            member_ts=(),
            member_end=(),
        )
        for index, (start, length, records) in enumerate(found)
    ]
    number_of, count = whole_sessions(units, None)
    expected = naive_sessions([(u.start_ms, u.end_ms) for u in units])
    assert count == len(expected)
    for unit in units:
        start, end, _ = sorted(expected)[number_of[(unit.version, unit.run)]]
        assert start <= unit.start_ms and unit.end_ms <= end


def test_runs_that_meet_at_a_cut_are_in_two_sessions():
    units = [
        Unit(
            version=0,
            run=run,
            start_ms=start,
            end_ms=end,
            records=1,
            first_member=0,
            member_ts=(),
            member_end=(),
        )
        for run, (start, end) in enumerate([(50, 60), (60, 65), (64, 70)])
    ]
    assert whole_sessions(units, 60) == ({(0, 0): 0, (0, 1): 1, (0, 2): 1}, 2)
    assert whole_sessions(units, None)[1] == 1


NEWEST = [1_000, 5_000, 5_000, 9_000]  # the newest event time after each of four steps


def test_a_session_never_fired_has_no_delay():
    assert first_firing(None, NEWEST) == {"fired_at_end": False}


def test_a_session_fired_by_the_end_of_input_only_is_counted_apart():
    assert first_firing((4, 8_000), NEWEST) == {"fired_at_end": True}


def test_a_firing_delay_runs_from_the_sessions_end_to_the_newest_event_time():
    # The end 4 s was reached at step 1; fired at step 3, when the data had reached 9 s.
    assert first_firing((3, 4_000), NEWEST) == {
        "fired_at_end": False,
        "delay_event": 5_000,
        "delay_batches": 2,
    }


def test_a_session_fired_before_the_data_reached_its_end_has_no_delay_in_batches():
    assert first_firing((0, 12_000), NEWEST) == {
        "fired_at_end": False,
        "delay_event": -11_000,
        "delay_batches": None,
    }
