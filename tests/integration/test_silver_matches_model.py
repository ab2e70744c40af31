"""The Spark silver engine equals the reference model, exactly, on random
multi-partition streams with random micro-batching (DESIGN §2)."""

from __future__ import annotations

import itertools
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.engine import (
    BASE_MS,
    assert_reconciles,
    engine_config,
    engine_history,
    engine_quarantine,
    engine_windows,
    model_history,
    model_of,
    model_quarantine,
    model_windows,
    payload,
    replay_batches,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

EXAMPLES = int(os.environ.get("TIDEMARK_ENGINE_EXAMPLES", "6"))

records = st.lists(
    st.builds(
        lambda partition, offset, device, battery, speed: payload(
            partition, BASE_MS + offset * 500, device, battery / 2, float(speed)
        ),
        st.integers(0, 2),
        st.integers(-10, 80),  # half-second steps over ~45 s, a little before the epoch base
        st.sampled_from(["d1", "d2"]),
        st.integers(0, 200),
        st.integers(0, 3),
    ),
    min_size=1,
    max_size=14,
)


@st.composite
def batched(draw):
    stream = draw(records)
    cuts = sorted(draw(st.sets(st.integers(1, len(stream) - 1), max_size=4)) if len(stream) > 1 else [])
    bounds = [0, *cuts, len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(bounds)]


windows = st.sampled_from(
    [
        {"type": "tumbling", "size": "10s", "offset": "0s"},
        {"type": "tumbling", "size": "10s", "offset": "3s"},
        {"type": "sliding", "size": "10s", "slide": "5s"},
    ]
)
watermarks = st.sampled_from(
    [
        {"strategy": "bounded", "max_out_of_orderness": "2s"},
        {"strategy": "bounded", "max_out_of_orderness": "0s"},
        {"strategy": "monotonous"},
    ]
)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    batches=batched(),
    window=windows,
    watermark=watermarks,
    lateness=st.sampled_from(["0s", "3s"]),
    flush=st.booleans(),
)
def test_silver_windows_quarantine_and_history_equal_the_reference_model(
    spark, tmp_path_factory, batches, window, watermark, lateness, flush
):
    root = tmp_path_factory.getbasetemp() / "engine-vs-model"
    root.mkdir(exist_ok=True)
    config = engine_config(window, watermark, lateness)
    registry = replay_batches(spark, config, root, batches, flush=flush)
    expected = model_of(config, batches, flush=flush)

    assert engine_windows(spark, registry) == model_windows(config, expected)
    assert engine_quarantine(spark, registry) == model_quarantine(expected)
    assert engine_history(spark, registry) == model_history(expected)
    assert_reconciles(spark, registry, [record for batch in batches for record in batch])
