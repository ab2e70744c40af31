import json
from dataclasses import replace

import pytest

from spark_jobs.config import ConfigError, load_pipeline
from spark_jobs.jobs.backfill import batches_by_column, batches_by_size, column_values, replay_config
from tests.unit.test_config import PIPELINES


def test_batch_size_cuts_in_file_order_with_a_short_last_batch():
    assert list(batches_by_size(["a", "b", "c", "d", "e"], 2)) == [["a", "b"], ["c", "d"], ["e"]]


def test_a_batch_column_starts_a_batch_wherever_its_value_changes():
    records = ["r1", "r2", "r3", "r4"]
    assert list(batches_by_column(records, [1, 1, 2, 1])) == [["r1", "r2"], ["r3"], ["r4"]]


def test_a_malformed_record_stays_in_the_batch_it_arrived_in():
    records = [json.dumps({"b": 1}), "{broken", json.dumps({"b": 2})]
    assert column_values(records, "b", "json", None) == [1, 1, 2]


def test_csv_batch_column_is_read_by_header_name():
    assert column_values(["x,1", "y,2"], "b", "csv", "a,b") == ["1", "2"]


def test_a_batch_column_no_record_has_is_an_error_naming_the_flag():
    with pytest.raises(ConfigError, match="--batch-column"):
        column_values([json.dumps({"a": 1})], "b", "json", None)


def test_replay_needs_a_partition_column():
    config = replace(load_pipeline(PIPELINES / "telemetry.yaml"), partition_column=None)
    with pytest.raises(ConfigError, match="partition_column"):
        replay_config(config, "/tmp/landing")


def test_replay_reads_one_landed_file_per_bronze_trigger():
    config = replay_config(load_pipeline(PIPELINES / "telemetry.yaml"), "/tmp/landing")
    assert (config.source.kind, config.source.path, config.source.max_files_per_trigger) == (
        "files",
        "/tmp/landing",
        1,
    )
