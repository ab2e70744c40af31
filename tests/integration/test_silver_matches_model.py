"""The Spark silver engine equals the reference model, exactly, on random
multi-partition streams with random micro-batching (DESIGN §2): with partitions
that stay silent for the first batches and then send, partitions declared up front
that never send, idleness, and silver running after every bronze batch, so that it
learns of the input still to come only from the source's reported lag."""

from __future__ import annotations

import itertools
import os

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.integration.engine import (
    BASE_MS,
    assert_engine_equals_model,
    engine_config,
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
    # One partition may start late: silent for the first batches, then sending.
    late_starter = draw(st.sampled_from([None, 0, 1, 2]))
    stream = sorted(stream, key=lambda record: record["partition"] == late_starter)
    cuts = sorted(draw(st.sets(st.integers(1, len(stream) - 1), max_size=4)) if len(stream) > 1 else [])
    bounds = [0, *cuts, len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(bounds)]


TUMBLING_10S = {"type": "tumbling", "size": "10s", "offset": "0s"}
BOUND_0S = {"strategy": "bounded", "max_out_of_orderness": "0s"}
windows = st.sampled_from(
    [
        TUMBLING_10S,
        {"type": "tumbling", "size": "10s", "offset": "3s"},
        {"type": "sliding", "size": "10s", "slide": "5s"},
    ]
)
watermarks = st.sampled_from(
    [
        {"strategy": "bounded", "max_out_of_orderness": "2s"},
        BOUND_0S,
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
    idleness=st.sampled_from([None, "1ms"]),
    declared=st.sampled_from([(), (0, 1, 2, 3)]),
    silver_every_batch=st.booleans(),
    lateness=st.sampled_from(["0s", "3s"]),
    flush=st.booleans(),
)
# Partition 3 is declared and never sends: it holds the watermark at -inf, so
# nothing fires before the flush and nothing is late.
@example(
    batches=[[payload(0, BASE_MS + 20_000, "d1", 1.0, 1.0)], [payload(1, BASE_MS, "d2", 2.0, 2.0)]],
    window=TUMBLING_10S,
    watermark=BOUND_0S,
    idleness=None,
    declared=(0, 1, 2, 3),
    silver_every_batch=False,
    lateness="0s",
    flush=True,
)
# Silver after every bronze batch, partitions idle after a millisecond: partition 1
# is silent in the first two batches, but the source reports its lag, so it is
# never idle and its old records are on time.
@example(
    batches=[
        [payload(0, BASE_MS + 20_000, "d1", 1.0, 1.0)],
        [payload(0, BASE_MS + 30_000, "d1", 1.0, 1.0)],
        [payload(1, BASE_MS, "d2", 2.0, 2.0)],
    ],
    window=TUMBLING_10S,
    watermark=BOUND_0S,
    idleness="1ms",
    declared=(),
    silver_every_batch=True,
    lateness="0s",
    flush=False,
)
def test_silver_windows_quarantine_and_history_equal_the_reference_model(
    spark,
    tmp_path_factory,
    batches,
    window,
    watermark,
    idleness,
    declared,
    silver_every_batch,
    lateness,
    flush,
):
    root = tmp_path_factory.getbasetemp() / "engine-vs-model"
    root.mkdir(exist_ok=True)
    config = engine_config(window, {**watermark, "idleness": idleness}, lateness, partitions=declared)
    registry = replay_batches(
        spark, config, root, batches, flush=flush, silver_every_batch=silver_every_batch
    )
    assert_engine_equals_model(spark, config, registry, batches, flush)
