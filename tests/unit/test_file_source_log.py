"""Which landed files a file stream has committed, from its checkpoint alone."""

import json
import os

import pytest

from spark_jobs.sources.files import (
    committed_landing_files,
    committed_log_offset,
    log_files_up_to,
    logged_names,
)


def log_file(*entries: tuple[str, int]) -> str:
    """A file source's log file as Spark writes it: a version line, then an entry a line."""
    return "\n".join(
        ["v1", *(json.dumps({"path": path, "timestamp": 1, "batchId": batch}) for path, batch in entries)]
    )


def test_the_log_up_to_an_offset_is_its_last_compaction_then_each_later_file():
    names = ["0", "1.compact", "2", "3.compact", "4", "5", ".5.crc"]
    assert log_files_up_to(names, 5) == ["3.compact", "4", "5"]


def test_a_compaction_or_file_past_the_committed_offset_is_not_read():
    names = ["1.compact", "2", "3.compact", "4"]
    assert log_files_up_to(names, 2) == ["1.compact", "2"]


def test_without_a_compaction_every_file_up_to_the_offset_is_read():
    assert log_files_up_to(["0", "1", "2", "3"], 2) == ["0", "1", "2"]


def test_a_log_with_no_file_up_to_the_offset_holds_nothing_to_read():
    assert log_files_up_to([], 0) == []


def test_logged_names_are_the_names_the_folder_lists_up_to_the_offset():
    text = log_file(
        ("file:///landing/part-1.json", 0),
        ("file:///landing/a%20day%2520.json", 1),
        ("file:///landing/later.json", 2),
    )
    assert logged_names(text, 1) == {"part-1.json", "a day%20.json"}


def test_the_committed_log_offset_is_the_file_sources_line_of_the_batchs_offsets():
    offsets = 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}\n{"logOffset":7}'
    assert committed_log_offset(offsets) == 7


@pytest.mark.spark
def test_a_file_streams_committed_files_are_read_from_its_checkpoint_across_compactions(spark, tmp_path):
    """Spark's own log, compacted every second offset, a file a micro-batch."""
    landing, checkpoint = tmp_path / "landing", tmp_path / "checkpoint"
    landing.mkdir()
    names = ["part-0.json", "a day%20.json", "part-2.json", "part-3.json", "part-4.json"]
    for at, name in enumerate(names):
        (landing / name).write_text("{}\n")
        os.utime(landing / name, (1_000 + at, 1_000 + at))  # the stream takes them in this order
    assert committed_landing_files(spark, str(checkpoint)) == set()
    spark.conf.set("spark.sql.streaming.fileSource.log.compactInterval", "2")
    try:
        (
            spark.readStream.option("maxFilesPerTrigger", 1)
            .text(str(landing))
            .writeStream.format("noop")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
            .awaitTermination()
        )
    finally:
        spark.conf.unset("spark.sql.streaming.fileSource.log.compactInterval")
    assert sorted(os.listdir(checkpoint / "sources" / "0"))[-2:] == ["3.compact", "4"]
    assert committed_landing_files(spark, str(checkpoint)) == set(names)

    # A batch whose offsets were logged but that did not commit read nothing yet.
    (checkpoint / "commits" / "4").unlink()
    assert committed_landing_files(spark, str(checkpoint)) == set(names[:4])
