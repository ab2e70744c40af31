import pytest

from spark_jobs.eventtime.windows import Window, WindowSpec, is_cleaned, is_fired


def test_tumbling_window_is_half_open_so_a_boundary_record_starts_the_next_window():
    spec = WindowSpec.tumbling(10_000)
    assert spec.assign(9_999) == [Window(0, 10_000)]
    assert spec.assign(10_000) == [Window(10_000, 20_000)]


def test_negative_timestamps_use_the_floor_mod_start():
    spec = WindowSpec.tumbling(10_000)
    assert spec.assign(-1) == [Window(-10_000, 0)]
    assert spec.assign(-10_000) == [Window(-10_000, 0)]
    assert spec.assign(-10_001) == [Window(-20_000, -10_000)]


def test_offset_shifts_window_starts():
    spec = WindowSpec.tumbling(60_000, offset_ms=15_000)
    assert spec.assign(14_999) == [Window(-45_000, 15_000)]
    assert spec.assign(15_000) == [Window(15_000, 75_000)]


def test_sliding_windows_give_every_window_containing_the_record_latest_first():
    spec = WindowSpec.sliding(10_000, 5_000)
    assert spec.assign(12_000) == [Window(10_000, 20_000), Window(5_000, 15_000)]
    assert spec.assign(-1) == [Window(-5_000, 5_000), Window(-10_000, 0)]


def test_sliding_window_count_is_size_over_slide():
    spec = WindowSpec.sliding(60_000, 15_000)
    assert all(len(spec.assign(ts)) == 4 for ts in range(-100_000, 100_000, 7_919))


def test_window_fires_at_watermark_end_minus_one_and_not_before():
    window = Window(0, 10_000)
    assert not is_fired(window, 9_998)
    assert is_fired(window, 9_999)


def test_window_is_cleaned_at_end_minus_one_plus_lateness():
    window = Window(0, 10_000)
    assert not is_cleaned(window, 11_998, 2_000)
    assert is_cleaned(window, 11_999, 2_000)


@pytest.mark.parametrize(("size", "slide"), [(0, 0), (10, 0), (10, 20), (-5, -5)])
def test_impossible_window_shapes_are_refused(size, slide):
    with pytest.raises(ValueError):
        WindowSpec(size, slide)


@pytest.mark.parametrize(
    "spec", [WindowSpec.tumbling(60), WindowSpec.sliding(60, 20, 5), WindowSpec.tumbling(7, 3)]
)
@pytest.mark.parametrize("watermark", [-1_001, -1, 0, 58, 59, 60, 118, 125, 10**9 + 7])
def test_the_last_fired_window_is_the_latest_ending_window_the_watermark_has_passed(spec, watermark):
    # Naively: every window holding a timestamp near the watermark, the latest-ending fired one.
    candidates = {w for t in range(watermark - 2 * spec.size_ms, watermark + 2, 1) for w in spec.assign(t)}
    fired = [window for window in candidates if is_fired(window, watermark)]
    assert spec.last_fired(watermark) == max(fired, key=lambda window: window.end)
