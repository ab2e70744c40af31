"""How a Delta commit file a crash of the machine damaged is told from a whole one, which
stream batch what is left of it names, and whether a stream's offsets reached it."""

from __future__ import annotations

import json

from spark_jobs.lakehouse.commit_files import commit_label, is_whole_commit, reads_from
from spark_jobs.lakehouse.log import BatchLabel, batch_metadata

LABEL = batch_metadata("app-1", 7, {"partitions_written": ["0"]}, job="bronze")
COMMIT = (
    json.dumps({"commitInfo": {"timestamp": 1, "operation": "WRITE", "userMetadata": LABEL}})
    + "\n"
    + json.dumps({"txn": {"appId": "app-1", "version": 7}})
    + "\n"
    + json.dumps({"add": {"path": "part-0.parquet", "size": 10, "dataChange": True}})
    + "\n"
)


def test_a_commit_as_delta_writes_it_is_whole():
    assert is_whole_commit(COMMIT)


def test_a_commit_whose_values_hold_unicode_line_separators_is_whole():
    raw = {"add": {"path": "p.parquet", "stats": '{"raw": "a\u2028b\u0085c\u001ed"}'}}
    text = COMMIT + json.dumps(raw, ensure_ascii=False) + "\n"
    assert "\u2028" in text and is_whole_commit(text)


def test_an_empty_commit_is_not_whole():
    assert not is_whole_commit("")


def test_a_commit_cut_inside_a_line_is_not_whole():
    assert not is_whole_commit(COMMIT[: len(COMMIT) - 20])


def test_a_commit_whose_last_line_lost_its_end_is_not_whole():
    assert not is_whole_commit(COMMIT[:-1])


def test_a_commit_without_its_commit_info_is_not_whole():
    assert not is_whole_commit(COMMIT.split("\n", 1)[1])


def test_a_line_that_is_not_one_action_is_not_whole():
    assert not is_whole_commit(COMMIT + json.dumps({"add": {}, "remove": {}}) + "\n")
    assert not is_whole_commit(COMMIT + "[1, 2]\n")


def test_what_is_left_of_a_cut_commit_names_its_stream_batch():
    assert commit_label(COMMIT[: COMMIT.index("\n") + 5]) == BatchLabel("app-1", 7, "bronze")


def test_an_empty_commit_names_no_batch():
    assert commit_label("") is None


def test_a_commit_cut_inside_its_commit_info_names_no_batch():
    assert commit_label(COMMIT[:30]) is None


def offsets(*entries: dict | str) -> str:
    lines = ["v1", json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1})]
    return "\n".join(lines + [entry if isinstance(entry, str) else json.dumps(entry) for entry in entries])


def delta(table_id: str, version: int, index: int) -> dict:
    return {"sourceVersion": 1, "reservoirId": table_id, "reservoirVersion": version, "index": index}


def test_offsets_at_a_version_before_its_first_file_have_not_read_it():
    assert not reads_from(offsets(delta("t", 5, -1)), "t", 5)


def test_offsets_inside_or_past_a_version_have_read_it():
    assert reads_from(offsets(delta("t", 5, 0)), "t", 5)
    assert reads_from(offsets(delta("t", 6, -1)), "t", 5)


def test_offsets_of_another_table_or_no_source_say_nothing_of_this_one():
    assert not reads_from(offsets(delta("other", 9, 3), "-"), "t", 5)
