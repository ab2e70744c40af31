"""Whether a streaming checkpoint's log file is whole, as Spark writes one: a version
line, then one entry per line (an offsets file: the batch's metadata and an offset
per source, ``-`` for none; a commits file: one entry)."""

from __future__ import annotations

import pytest

from spark_jobs.lakehouse.checkpoints import is_whole_log_file

OFFSETS = 'v1\n{"batchWatermarkMs":0,"conf":{"a":"1"}}\n{"logOffset":1}'
COMMITS = 'v1\n{"nextBatchWatermarkMs":0}'


def test_a_whole_offsets_or_commits_file_is_whole():
    assert is_whole_log_file(OFFSETS, "offsets", OFFSETS)
    assert is_whole_log_file(OFFSETS, "offsets", None)
    assert is_whole_log_file('v1\n{"batchWatermarkMs":0}\n-', "offsets", None)
    assert is_whole_log_file(COMMITS, "commits", COMMITS)


@pytest.mark.parametrize(
    ("text", "folder"),
    [
        ("", "offsets"),
        ("", "commits"),
        (OFFSETS[: len(OFFSETS) // 2], "offsets"),
        (OFFSETS[:-3], "offsets"),
        (COMMITS[:-4], "commits"),
        ("v1", "commits"),
        ('{"nextBatchWatermarkMs":0}', "commits"),
    ],
    ids=[
        "empty offsets",
        "empty commits",
        "half",
        "cut in its last entry",
        "cut commit",
        "version only",
        "no version",
    ],
)
def test_a_file_cut_short_is_not_whole(text, folder):
    assert not is_whole_log_file(text, folder, OFFSETS if folder == "offsets" else COMMITS)


def test_an_offsets_file_missing_a_source_its_predecessor_has_is_not_whole():
    two_sources = OFFSETS + '\n{"logOffset":4}'
    assert not is_whole_log_file(OFFSETS, "offsets", two_sources)
