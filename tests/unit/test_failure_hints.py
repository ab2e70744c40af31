"""What a failed stream says of its checkpoint: the damaged log file and the command
to run, nothing when the checkpoint is whole, and nothing (the failure's own error
stands) when the checkpoint cannot be read either."""

from __future__ import annotations

from types import SimpleNamespace

from spark_jobs.jobs import common
from spark_jobs.lakehouse.checkpoints import DamagedLogFile


def stream() -> SimpleNamespace:
    config = SimpleNamespace(source_file="/p/telemetry.yaml", name="telemetry")
    context = SimpleNamespace(
        job="silver",
        checkpoint="/l/_checkpoints/telemetry/silver",
        config=config,
        registry=SimpleNamespace(root="/l"),
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
