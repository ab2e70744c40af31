"""Gold's rollup of session windows: each fired or closed session counts in the grain
it starts in, and a grain a session leaves (merged away, or its start moved by a late
record) is recomputed without it, by the gold stream and by the late merge alike."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from pyspark.sql import Row
from pyspark.sql.types import LongType, StringType, StructField, StructType

from spark_jobs.config import parse_pipeline
from spark_jobs.engine.gold_store import feed_keys
from spark_jobs.engine.late_merge import TimeRange, dry_run, merge_late
from spark_jobs.eventtime.sessions import MERGED, ReferenceSessions
from spark_jobs.generator import land_files
from spark_jobs.lakehouse.log import table_version
from spark_jobs.tables import TableRegistry
from spark_jobs.transforms.gold import rollup
from tests.integration.engine import BASE_MS, engine_document, model_batches, run_jobs
from tests.integration.test_session_engine import assert_sessions_equal_model, at
from tests.integration.test_silver_matches_model import BOUND_0S

pytestmark = [pytest.mark.spark]

GOLD_5S = {"name": "g", "grain": "5s", "group_by": ["region"]}


def sessions_config():
    document = engine_document({"type": "session", "gap": "3s"}, BOUND_0S, gold=GOLD_5S)
    return parse_pipeline({**document, "measures": {"battery": ["sum"]}})


def moment(seconds: float) -> datetime:
    return datetime.fromtimestamp(BASE_MS / 1000 + seconds, UTC)


def session(registry: TableRegistry, device: str, start: float, status: str, records: int) -> dict:
    """A silver session row of ``device`` starting ``start`` seconds after the base."""
    values = {
        "region": "r1",
        "device_id": device,
        "session_id": f"{device}@{start}",
        "session_start": moment(start),
        "session_end": moment(start + 3),
        "record_count": records,
        "battery_sum": float(records),
        "battery_sum_state": None,
        "revision": 1,
        "status": status,
        "merged_into": None,
        "updated_at": moment(0),
        "tier": "live",
    }
    return {name: values.get(name) for name in registry.silver.schema.fieldNames()}


def gold_of(rows: list[Row]) -> dict:
    """grain start (seconds after the base) -> (records, sessions, keys, battery sum)."""
    return {
        (int(row.grain_start.timestamp() * 1000) - BASE_MS) // 1000: (
            row.record_count,
            row.session_count,
            row.key_count,
            row.battery_sum,
        )
        for row in rows
    }


def test_a_session_counts_in_the_grain_it_starts_in_and_open_or_merged_ones_not_at_all(spark, tmp_path):
    registry = TableRegistry(sessions_config(), str(tmp_path))
    rows = [
        session(registry, "d1", 4, "fired", 3),  # ends in the next grain, counts in this one
        session(registry, "d2", 6, "closed", 2),
        session(registry, "d3", 7, "closed", 1),
        session(registry, "d4", 8, "open", 5),
        session(registry, "d5", 9, "merged", 7),
    ]
    frame = spark.createDataFrame(rows, registry.silver.schema)
    assert gold_of(rollup(frame, registry.config).collect()) == {0: (3, 1, 1, 3.0), 5: (3, 2, 2, 3.0)}


def test_the_gold_stream_refreshes_the_grain_a_session_left_as_well_as_the_one_it_joined(spark, tmp_path):
    registry = TableRegistry(sessions_config(), str(tmp_path))
    silver = registry.silver.schema
    feed_columns = [StructField("_change_type", StringType()), StructField("_commit_version", LongType())]
    schema = StructType([*silver.fields, *feed_columns])
    moved_from, moved_to = session(registry, "d1", 11, "fired", 1), session(registry, "d1", 9, "fired", 2)
    absorbed, merged = session(registry, "d2", 21, "fired", 1), session(registry, "d2", 21, "merged", 1)
    unchanged = session(registry, "d3", 31, "fired", 1)
    changes = [
        (moved_from, "delete"),
        (moved_to, "insert"),
        (absorbed, "update_preimage"),
        (merged, "update_postimage"),
        (unchanged, "delete"),  # an overwrite rewrote it as it was
        (unchanged, "insert"),
    ]
    rows = [{**row, "_change_type": kind, "_commit_version": 3} for row, kind in changes]
    feed = spark.createDataFrame(rows, schema)
    grains = {(int(key.grain_ms) - BASE_MS) // 1000 for key in feed_keys(feed, registry)}
    assert grains == {5, 10, 20}


def land_and_run(spark, registry: TableRegistry, records: list[dict], *jobs: str) -> None:
    land_files([[json.dumps(record) for record in records]], registry.landing_path, "json")
    run_jobs(spark, registry, "bronze", "silver", *jobs)


def gold_table(spark, registry: TableRegistry) -> dict:
    return gold_of(spark.read.format("delta").load(registry.gold.path).collect())


def test_an_allowed_late_record_bridging_two_fired_sessions_merges_them_and_gold_follows_them(
    spark, tmp_path, capsys
):
    """The bridge revises the earlier session and marks the later one merged into it;
    the gold stream drops the later one's grain, and a late merge that moves a closed
    session's start moves it to the earlier grain."""
    document = engine_document({"type": "session", "gap": "3s"}, BOUND_0S, "10s", gold=GOLD_5S)
    config = parse_pipeline({**document, "measures": {"battery": ["sum"]}})
    registry = TableRegistry(config, str(tmp_path / config.name))
    batches = [
        [at(0, 0), at(0, 5)],  # d1: two sessions, [0, 3) fires
        [at(0, 10, "d2")],  # d1's [5, 8) fires
        [at(0, 3), at(0, 30, "d2")],  # allowed late: bridges d1's two; d2's [10, 13) closes
        [at(0, 8, "d2")],  # too late for d2's closed session: quarantined
    ]
    land_and_run(spark, registry, batches[0])
    land_and_run(spark, registry, batches[1], "gold")
    assert gold_table(spark, registry) == {0: (1, 1, 1, 1.0), 5: (1, 1, 1, 1.0)}
    land_and_run(spark, registry, batches[2], "gold")
    # d1's second session merged into the first: grain 5 has no session left.
    assert gold_table(spark, registry) == {0: (3, 1, 1, 3.0), 10: (1, 1, 1, 1.0)}
    land_and_run(spark, registry, batches[3])

    # A dry run speaks of the one pending record, its key, and the gold key its key's
    # fired and closed sessions count in (d2's [10, 13) in grain 10); it writes nothing.
    tables = (registry.silver.path, registry.gold.path, registry.quarantine.path)
    untouched = [table_version(spark, path) for path in tables]
    report = dry_run(spark, registry, TimeRange())
    out = capsys.readouterr().out
    assert (report.records, report.windows, report.gold_keys) == (1, 1, 1)
    assert (
        "pending late records: 1\n" in out and "keys whose sessions they extend, bridge or start: 1\n" in out
    )
    assert [table_version(spark, path) for path in tables] == untouched

    merge_late(spark, registry, TimeRange())
    # d2's closed session now starts at 8 s: it left grain 10 for grain 5.
    assert gold_table(spark, registry) == {0: (3, 1, 1, 3.0), 5: (2, 1, 1, 2.0)}
    run_jobs(spark, registry, "gold")
    assert gold_table(spark, registry) == {0: (3, 1, 1, 3.0), 5: (2, 1, 1, 2.0)}

    model = ReferenceSessions(config.rules())
    model.run(model_batches(config, batches))
    assert [quarantined.record.payload["ts"] for quarantined in model.quarantined] == [BASE_MS + 8_000]
    model.fold_late()
    assert_sessions_equal_model(spark, registry, batches, model.result())
    first, second = sorted(
        (s for s in model.result().sessions.values() if s.key[1] == "d1"), key=lambda s: s.extent.start
    )
    assert (first.revision, first.record_count, first.extent.end - first.extent.start) == (2, 3, 8_000)
    assert (second.status, second.merged_into) == (MERGED, first.session_id)
