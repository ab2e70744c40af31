"""Custom watermark generators (``strategy: custom``): what a generator is told, the
rules Tidemark keeps around its answers, its state across a restart, the shipped
adaptive bound, and the pipeline file's checks."""

from __future__ import annotations

import json
import sys
from fractions import Fraction
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.config import ConfigError, load_pipeline, parse_pipeline
from spark_jobs.eventtime import MAX_WATERMARK, MIN_WATERMARK
from spark_jobs.eventtime.adaptive import AdaptiveBound
from spark_jobs.eventtime.generators import (
    DISORDER_QUANTILES,
    BatchSummary,
    GeneratorError,
    WatermarkSpec,
    disorder_behind,
    quantile_timestamps,
)
from spark_jobs.eventtime.model import Batch, Record, Rules, run_reference, summarize
from spark_jobs.eventtime.tracker import PartitionSnapshot, WatermarkTracker
from spark_jobs.eventtime.windows import WindowSpec

USER = "tests.unit.user_generators"
REPO = Path(__file__).resolve().parents[2]
PIPELINES = REPO / "spark_jobs" / "pipelines"


def custom(name: str, **options) -> WatermarkSpec:
    return WatermarkSpec("custom", generator=f"{USER}:{name}", options=options)


def batch_of(*timestamps: int, partition: str = "0") -> dict:
    return summarize([Record(partition, ts) for ts in timestamps])


def naive_disorder(running_max: int, timestamps: list[int]) -> dict[float, int]:
    """From the definition: every record's lag behind the running maximum (0 when
    at or beyond it); a quantile q is the smallest lag whose share of the lags at
    or below it reaches q (SQL's percentile_disc), in exact fractions."""
    lags = [max(0, running_max - ts) for ts in timestamps]
    quantiles = (Fraction(1, 2), Fraction(9, 10), Fraction(99, 100), Fraction(1))
    return {
        float(q): min(lag for lag in lags if Fraction(sum(other <= lag for other in lags), len(lags)) >= q)
        for q in quantiles
    }


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-1_000, 1_000), min_size=1, max_size=250), st.integers(-1_200, 1_200))
def test_the_disorder_quantiles_equal_a_naive_percentile_over_every_lag(timestamps, running_max):
    assert disorder_behind(running_max, quantile_timestamps(timestamps)) == naive_disorder(
        running_max, timestamps
    )


def test_there_is_no_disorder_before_a_partitions_first_data_or_without_data():
    assert disorder_behind(None, quantile_timestamps([5, 6])) == {}
    assert disorder_behind(10, quantile_timestamps([])) == {}


def test_a_custom_generator_is_told_its_partitions_batch_and_the_running_maximum_before_it():
    tracker = WatermarkTracker(custom("Recording"))
    tracker.advance(0, batch_of(100, 70))
    tracker.advance(1, batch_of(90, 120, 40, 100))
    first, second = tracker.generators["0"].custom.seen
    assert first == BatchSummary(
        rows=2, max_timestamp=100, min_timestamp=70, max_marker=None, running_max=None
    )
    assert second.rows == 4 and (second.min_timestamp, second.max_timestamp) == (40, 120)
    assert second.running_max == 100
    # Lags behind 100: 10, 0, 60, 0 -> ascending 0, 0, 10, 60.
    assert second.disorder == {0.5: 0, 0.9: 60, 0.99: 60, 1.0: 60}


def test_each_partition_has_its_own_generator_and_only_its_own_records():
    tracker = WatermarkTracker(custom("Recording"))
    tracker.advance(0, {**batch_of(5, partition="a"), **batch_of(50, 60, partition="b")})
    assert [s.rows for s in tracker.generators["a"].custom.seen] == [1]
    assert [s.max_timestamp for s in tracker.generators["b"].custom.seen] == [60]


def test_markers_alone_give_a_summary_without_data_or_disorder():
    tracker = WatermarkTracker(custom("Recording"))
    tracker.advance(0, batch_of(100))
    tracker.advance(1, summarize([Record("0", 80, marker=True)]))
    markers_only = tracker.generators["0"].custom.seen[1]
    assert (markers_only.rows, markers_only.max_timestamp, markers_only.max_marker) == (0, None, 80)
    assert markers_only.running_max == 100 and markers_only.disorder == {}


def test_a_custom_candidate_never_moves_the_partition_watermark_back_and_none_keeps_it():
    tracker = WatermarkTracker(custom("Recording", answers=(50, 20, None, 70)))
    watermarks = [tracker.advance(step, batch_of(1_000)).watermark for step in range(4)]
    assert watermarks == [50, 50, 50, 70]


@pytest.mark.parametrize("answer", ["soon", 1.5, True])
def test_a_candidate_that_is_not_an_integer_is_an_error_naming_the_generator(answer):
    tracker = WatermarkTracker(custom("Recording", answers=(answer,)))
    with pytest.raises(GeneratorError, match=rf"user_generators:Recording\.on_batch returned {answer!r}"):
        tracker.advance(0, batch_of(1))


def test_a_generator_that_fails_is_an_error_naming_it():
    tracker = WatermarkTracker(custom("FailsOnBatch"))
    with pytest.raises(GeneratorError, match=r"user_generators:FailsOnBatch\.on_batch failed: KeyError"):
        tracker.advance(0, batch_of(1))


def test_a_candidate_at_plus_infinity_stays_below_the_end_of_input():
    tracker = WatermarkTracker(custom("Recording", answers=(MAX_WATERMARK,)))
    assert tracker.advance(0, batch_of(1)).watermark == MAX_WATERMARK - 1


def test_a_stateful_generator_restored_from_its_snapshot_continues_as_if_never_stopped():
    spec = custom("ShrinkingBound", start=10_000, step=3_000)
    batches = [batch_of(ts) for ts in (20_000, 21_000, 22_000, 23_000)]
    uninterrupted = WatermarkTracker(spec)
    for step, sent in enumerate(batches):
        uninterrupted.advance(step, sent)

    stopped = WatermarkTracker(spec)
    for step, sent in enumerate(batches[:2]):
        stopped.advance(step, sent)
    restarted = WatermarkTracker(spec, stopped.watermark)
    for snapshot in stopped.snapshots():
        restarted.restore(snapshot)
    for step, sent in enumerate(batches[2:], start=2):
        restarted.advance(step, sent)

    assert restarted.snapshots() == uninterrupted.snapshots()
    assert restarted.watermark == uninterrupted.watermark == 23_000 - 1_000 - 1
    assert [s.generator_state for s in stopped.snapshots()] == [recorded("ShrinkingBound", {"bound": 4000})]


def recorded(name: str, state: object) -> str:
    """A generator's state as the clocks record it: the class that wrote it, and its snapshot."""
    return json.dumps({"generator": f"{USER}:{name}", "state": state}, sort_keys=True)


def test_a_partition_that_never_sent_records_no_state_before_or_after_a_restart():
    spec = custom("ShrinkingBound")
    tracker = WatermarkTracker(spec)
    tracker.declare(["silent"], 0)
    tracker.advance(1, batch_of(5))
    restarted = WatermarkTracker(spec, tracker.watermark)
    for snapshot in tracker.snapshots():
        restarted.restore(snapshot)
    assert {s.partition: s.generator_state for s in restarted.snapshots()} == {
        "0": recorded("ShrinkingBound", {"bound": 8000}),
        "silent": None,
    }
    assert restarted.snapshots() == tracker.snapshots()


def test_state_another_generator_class_wrote_is_not_restored():
    tracker = WatermarkTracker(custom("ShrinkingBound", start=10_000))
    tracker.restore(PartitionSnapshot("0", 5, 4, 0, False, True, recorded("OtherClass", {"bound": 0})))
    assert tracker.generators["0"].custom.bound == 10_000


def test_a_restore_that_fails_is_an_error_naming_the_generator():
    tracker = WatermarkTracker(custom("ShrinkingBound"))
    with pytest.raises(GeneratorError, match=r"ShrinkingBound\.restore failed on \{\}: KeyError"):
        tracker.restore(PartitionSnapshot("0", 5, 4, 0, False, True, recorded("ShrinkingBound", {})))


def test_a_snapshot_that_json_would_change_is_an_error():
    tracker = WatermarkTracker(custom("TupleState"))
    tracker.advance(0, batch_of(5))
    with pytest.raises(
        GeneratorError, match=r"TupleState\.snapshot\(\) returned \(1, 2\), which JSON does not give back"
    ):
        tracker.snapshots()


def test_a_generator_without_state_records_none():
    tracker = WatermarkTracker(custom("MedianDisorder"))
    tracker.advance(0, batch_of(5))
    assert [s.generator_state for s in tracker.snapshots()] == [None]


def test_a_snapshot_that_is_not_json_is_an_error_naming_the_generator():
    tracker = WatermarkTracker(custom("UnserializableState"))
    tracker.advance(0, batch_of(5))
    with pytest.raises(GeneratorError, match=r"UnserializableState\.snapshot\(\) returned no JSON-able data"):
        tracker.snapshots()


@st.composite
def partition_streams(draw) -> list[dict[str, list[int]]]:
    """Batches of raw timestamps per partition; a partition may skip batches."""
    sent = st.lists(st.integers(0, 500), min_size=1, max_size=12)
    return draw(st.lists(st.dictionaries(st.sampled_from("ab"), sent, max_size=2), min_size=1, max_size=8))


def naive_median_disorder(batches: list[dict[str, list[int]]], partition: str) -> int:
    """MedianDisorder's partition watermark recomputed from every raw timestamp: the
    largest candidate of any batch, each from the timestamps before it alone."""
    candidates = []
    for index, batch in enumerate(batches):
        if partition not in batch:
            continue
        earlier = [ts for before in batches[:index] for ts in before.get(partition, [])]
        lag = naive_disorder(max(earlier), batch[partition])[0.5] if earlier else 0
        candidates.append(max(earlier + batch[partition]) - lag - 1)
    return max(candidates, default=MIN_WATERMARK)


@settings(max_examples=200, deadline=None)
@given(partition_streams())
def test_the_tracker_with_a_stateless_generator_equals_a_recomputation_from_raw_timestamps(batches):
    tracker = WatermarkTracker(custom("MedianDisorder"))
    for step, batch in enumerate(batches):
        records = [Record(partition, ts) for partition, stamps in batch.items() for ts in stamps]
        tracker.advance(step, summarize(records))
    clocks = {snapshot.partition: snapshot.watermark for snapshot in tracker.snapshots()}
    for partition in clocks:
        assert clocks[partition] == naive_median_disorder(batches, partition)


def test_the_reference_model_runs_a_custom_generator():
    rules = Rules(WindowSpec(10_000, 10_000), custom("ShrinkingBound", start=4_000, step=4_000))
    result = run_reference(rules, [Batch([Record("0", 15_000)]), Batch([Record("0", 16_000)])])
    # 15,000 - 4,000 - 1, then the bound is 0: 16,000 - 0 - 1.
    assert result.watermarks == [10_999, 15_999]


# The shipped adaptive bound.


def adaptive_batch(running_max: int | None, newest: int, lag: int, quantile: float = 0.99) -> BatchSummary:
    return BatchSummary(
        1, newest, newest, None, running_max, {q: lag if q == quantile else 0 for q in DISORDER_QUANTILES}
    )


def test_the_adaptive_bound_starts_at_its_ceiling_so_nothing_is_late_before_disorder_is_seen():
    generator = AdaptiveBound(floor="1s", ceiling="1m")
    assert generator.on_batch(BatchSummary(1, 100_000, 100_000, None, None)) == 100_000 - 60_000 - 1


def test_the_adaptive_bound_grows_at_once_to_the_observed_quantile():
    generator = AdaptiveBound(floor="1s", ceiling="1m", initial="2s")
    assert generator.on_batch(adaptive_batch(100_000, 100_000, lag=9_000)) == 100_000 - 9_000 - 1


def test_the_adaptive_bound_shrinks_by_half_the_difference_per_batch():
    generator = AdaptiveBound(floor="1s", ceiling="1m", initial="40s")
    generator.on_batch(adaptive_batch(100_000, 100_000, lag=0))
    assert generator.bound_ms == 20_000  # halfway from 40 s to the observed 0 s
    generator.on_batch(adaptive_batch(100_000, 100_000, lag=10_000))
    assert generator.bound_ms == 15_000


def test_the_adaptive_bound_stays_within_its_floor_and_ceiling():
    generator = AdaptiveBound(floor="2s", ceiling="30s", initial="10s")
    generator.on_batch(adaptive_batch(0, 0, lag=3_600_000))
    assert generator.bound_ms == 30_000
    for _ in range(40):
        generator.on_batch(adaptive_batch(0, 0, lag=0))
    assert generator.bound_ms == 2_000


def test_the_adaptive_bound_follows_only_its_own_quantile():
    generator = AdaptiveBound(quantile=0.9, floor="0s", ceiling="1m", initial="0s")
    generator.on_batch(adaptive_batch(0, 0, lag=7_000, quantile=0.99))
    assert generator.bound_ms == 0
    generator.on_batch(adaptive_batch(0, 0, lag=7_000, quantile=0.9))
    assert generator.bound_ms == 7_000


def test_the_adaptive_bound_survives_a_restart_through_its_snapshot():
    generator = AdaptiveBound(floor="1s", ceiling="1m")
    generator.on_batch(adaptive_batch(100_000, 100_000, lag=5_000))
    restarted = AdaptiveBound(floor="1s", ceiling="1m")
    restarted.restore(generator.snapshot())
    assert restarted.bound_ms == generator.bound_ms != 60_000


# The pipeline file.


def document(**watermark) -> dict:
    telemetry = yaml.safe_load((PIPELINES / "telemetry.yaml").read_text())
    return {**telemetry, "watermark": {"strategy": "custom", **watermark}}


def test_the_pipeline_file_names_a_generator_class_with_its_options():
    config = parse_pipeline(
        document(
            generator="spark_jobs.eventtime.adaptive:AdaptiveBound", options={"floor": "2s"}, idleness="1m"
        )
    )
    assert config.watermark.generator == "spark_jobs.eventtime.adaptive:AdaptiveBound"
    assert config.watermark.new_generator().floor_ms == 2_000
    assert config.watermark.idleness_ms == 60_000


@pytest.mark.parametrize(
    ("watermark", "field", "problem"),
    [
        ({}, "watermark.generator", "required"),
        (
            {"generator": "no_such_module_here:Gen"},
            "watermark.generator",
            "cannot import 'no_such_module_here'",
        ),
        ({"generator": f"{USER}:Missing"}, "watermark.generator", f"module '{USER}' has no 'Missing'"),
        ({"generator": USER}, "watermark.generator", "expected 'package.module:Class'"),
        ({"generator": 42}, "watermark.generator", "expected 'package.module:Class'"),
        ({"generator": f"{USER}:NoOnBatch"}, "watermark.generator", "has no on_batch"),
        ({"generator": f"{USER}:OnBatchWithoutArgument"}, "watermark.generator", "must take one argument"),
        ({"generator": f"{USER}:SnapshotWithoutRestore"}, "watermark.generator", "both snapshot"),
        ({"generator": f"{USER}:NeedsAnOption"}, "watermark.options", "refused its options {}: TypeError"),
        (
            {"generator": f"{USER}:FailsToBuild"},
            "watermark.options",
            "refused its options {}: ValueError: no",
        ),
        ({"generator": "tests.unit.user_generators_broken:Any"}, "watermark.generator", "ZeroDivisionError"),
        ({"generator": f"{USER}:NeedsAnOption", "options": [1]}, "watermark.options", "expected a mapping"),
        (
            {"generator": "spark_jobs.eventtime.adaptive:AdaptiveBound", "options": {"floor": "soon"}},
            "watermark.options",
            "AdaptiveBound: floor: expected a duration",
        ),
        (
            {"generator": "spark_jobs.eventtime.adaptive:AdaptiveBound", "options": {"quantile": 0.7}},
            "watermark.options",
            "quantile must be one of",
        ),
        (
            {"generator": f"{USER}:MedianDisorder", "max_out_of_orderness": "5s"},
            "watermark.max_out_of_orderness",
            "only applies to the bounded strategy",
        ),
    ],
)
def test_a_custom_generator_that_cannot_be_used_is_an_error_naming_the_field(watermark, field, problem):
    with pytest.raises(ConfigError) as error:
        parse_pipeline(document(**watermark))
    assert error.value.field == field
    assert problem in error.value.problem


@pytest.mark.parametrize("key", ["generator", "options"])
def test_generator_settings_only_apply_to_the_custom_strategy(key):
    bounded = document(strategy="bounded", max_out_of_orderness="5s", **{key: {}})
    with pytest.raises(
        ConfigError, match=f"watermark.{key}: only applies to the custom strategy, not bounded"
    ):
        parse_pipeline(bounded)


def test_a_generator_module_beside_the_pipeline_file_is_found(tmp_path):
    (tmp_path / "beside_the_pipeline_file.py").write_text(
        "class Fixed:\n    def on_batch(self, batch):\n        return 1234\n"
    )
    path = tmp_path / "telemetry.yaml"
    path.write_text(yaml.safe_dump(document(generator="beside_the_pipeline_file:Fixed")))
    path_before = list(sys.path)
    config = load_pipeline(path)
    assert sys.path == path_before
    tracker = WatermarkTracker(config.watermark)
    assert tracker.advance(0, batch_of(5)).watermark == 1234


def test_the_documented_example_pipeline_runs_the_adaptive_bound():
    config = load_pipeline(
        Path(__file__).resolve().parents[2] / "docs" / "examples" / "telemetry-adaptive.yaml"
    )
    generator = config.watermark.new_generator()
    assert isinstance(generator, AdaptiveBound)
    assert (generator.quantile, generator.floor_ms, generator.ceiling_ms) == (0.99, 2_000, 120_000)


def test_modules_of_the_same_name_beside_two_pipeline_files_stay_apart(tmp_path):
    configs = []
    for folder, watermark in (("one", 111), ("two", 222)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "shared_name_generators.py").write_text(
            f"class Fixed:\n    def on_batch(self, batch):\n        return {watermark}\n"
        )
        path = tmp_path / folder / "telemetry.yaml"
        path.write_text(yaml.safe_dump(document(generator="shared_name_generators:Fixed")))
        configs.append(load_pipeline(path))
    answers = [WatermarkTracker(config.watermark).advance(0, batch_of(5)).watermark for config in configs]
    assert answers == [111, 222]
