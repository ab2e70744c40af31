"""What a failed job says it can tell of its failure: a full disk, with the lakehouse's
free space; a damaged checkpoint log file and the command to run, nothing when the
checkpoint is whole, and nothing (the failure's own error stands) when the checkpoint
cannot be read either."""

from __future__ import annotations

import errno
import os
import re
import shutil
from types import SimpleNamespace

import pytest

from spark_jobs.jobs import common
from spark_jobs.lakehouse.checkpoints import DamagedLogFile

JAVA_FULL_DISK = (
    "[STREAM_FAILED] Query terminated with exception: Job aborted.\n"
    "Caused by: java.io.IOException: No space left on device\n\tat java.base/java.io.FileOutputStream"
)


def stream(root: str = "/l") -> SimpleNamespace:
    config = SimpleNamespace(source_file="/p/telemetry.yaml", name="telemetry")
    context = SimpleNamespace(
        job="silver",
        checkpoint="/l/_checkpoints/telemetry/silver",
        config=config,
        registry=SimpleNamespace(root=root),
    )
    return SimpleNamespace(spark=None, context=context)


def test_a_damaged_file_is_named_with_the_repair_command(monkeypatch):
    damaged = DamagedLogFile("offsets", 7, "file:/l/_checkpoints/telemetry/silver/offsets/7")
    monkeypatch.setattr(common, "damaged_log_files", lambda spark, checkpoint: [damaged])
    hint = common.repair_hint(stream())
    assert hint.startswith(f"the checkpoint file {damaged.path} is damaged")
    assert "`tidemark repair --pipeline /p/telemetry.yaml --lakehouse /l`" in hint


def test_a_whole_checkpoint_gives_no_hint(monkeypatch):
    monkeypatch.setattr(common, "damaged_log_files", lambda spark, checkpoint: [])
    assert common.repair_hint(stream()) is None


def test_a_checkpoint_that_cannot_be_read_gives_no_hint_and_says_so(monkeypatch, capsys):
    def unreadable(spark, checkpoint):
        raise OSError("the store refused the request")

    monkeypatch.setattr(common, "damaged_log_files", unreadable)
    assert common.repair_hint(stream()) is None
    assert "could not check the checkpoint's logs: the store refused the request" in capsys.readouterr().err


def test_a_full_disk_is_named_with_the_lakehouse_and_its_free_space(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "damaged_log_files", lambda spark, checkpoint: [])
    hint = common.failure_hint(stream(f"file:{tmp_path}/lakehouse"), JAVA_FULL_DISK)
    free_mb = shutil.disk_usage(tmp_path).free / 1024 / 1024
    assert hint.startswith(f"a disk is full (No space left on device): the disk of {tmp_path}/lakehouse (")
    shown = float(re.search(r"\((\d+\.\d) MB free\)", hint).group(1))
    assert abs(shown - free_mb) < 64  # other processes write to the same disk meanwhile


def test_a_full_disk_under_an_object_store_lakehouse_names_this_machines_disks():
    hint = common.failure_hint(stream("s3a://bucket/lakehouse"), JAVA_FULL_DISK)
    assert hint.startswith("a disk is full (No space left on device): a disk of this machine")


def test_another_failure_is_left_to_the_checkpoint_check(monkeypatch):
    monkeypatch.setattr(common, "damaged_log_files", lambda spark, checkpoint: [])
    assert common.failure_hint(stream(), "java.io.IOException: No such file or directory") is None


def test_a_job_that_hits_a_full_disk_exits_1_with_its_trace_and_a_last_line_that_says_so(capsys):
    @common.exit_with_named_errors
    def main(argv):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    assert main([]) == 1
    error = capsys.readouterr().err
    assert "Traceback" in error
    assert error.strip().splitlines()[-1].startswith("tidemark test-failure-hints: error: a disk is full")


def test_a_job_that_fails_otherwise_raises_as_before():
    @common.exit_with_named_errors
    def main(argv):
        raise RuntimeError("the broker went away")

    with pytest.raises(RuntimeError, match="the broker went away"):
        main([])
