"""A merge served beside a live offline stream leaves the claimed late tracks to that
stream only while the stream will run a batch: one with no input runs none, and the
merge re-derives the tracks itself instead of waiting out the handover."""

from __future__ import annotations

import threading

import pytest

from spark_jobs.config import load_pipeline
from spark_jobs.engine import claims
from spark_jobs.engine.late_merge import folded_in
from spark_jobs.jobs.common import JobContext, Stream, query_name, stream_busy
from spark_jobs.lakehouse.runs import RunTotals
from spark_jobs.tables import TableRegistry
from tests.integration.conftest import PIPELINES, wait_for

pytestmark = [pytest.mark.spark]
A_LONG_WAIT_S = 600.0


def claims_table(spark, path: str, rows: list[tuple[str, str | None]]) -> str:
    spark.createDataFrame(rows, "status string, merge_run_id string").write.format("delta").save(path)
    return path


def counting(answer: bool):
    calls = []

    def busy() -> bool:
        calls.append(answer)
        return answer

    return busy, calls


def test_a_quiet_stream_is_waited_for_no_longer_than_one_look(spark, tmp_path):
    path = claims_table(spark, str(tmp_path / "tracks"), [(claims.PENDING, "run-1")])
    quiet, looks = counting(False)
    assert folded_in(spark, path, "run-1", A_LONG_WAIT_S, quiet) is False
    assert len(looks) == 1


def test_tracks_the_stream_folded_in_are_handed_over_without_asking_the_stream(spark, tmp_path):
    path = claims_table(spark, str(tmp_path / "tracks"), [("merged", "run-1"), (claims.PENDING, "run-2")])
    busy, looks = counting(True)
    assert folded_in(spark, path, "run-1", A_LONG_WAIT_S, busy) is True
    assert looks == []


def test_a_busy_stream_is_waited_for_until_the_handover_wait_ends(spark, tmp_path):
    path = claims_table(spark, str(tmp_path / "tracks"), [(claims.PENDING, "run-1")])
    busy, looks = counting(True)
    assert folded_in(spark, path, "run-1", 0.0, busy) is False
    assert looks == []  # the wait ended before the stream was asked


def test_a_stream_is_busy_only_while_a_batch_is_at_work_or_input_waits(spark, tmp_path):
    registry = TableRegistry(load_pipeline(PIPELINES / "telemetry.yaml"), str(tmp_path / "lakehouse"))
    checkpoint = str(tmp_path / "checkpoint")
    context = JobContext("offline", registry.config, registry, "continuous", 100, checkpoint)
    session = spark.newSession()
    landing = tmp_path / "landing"
    landing.mkdir()
    at_work, release = threading.Event(), threading.Event()

    def hold(batch, batch_id: int) -> None:
        at_work.set()
        release.wait(60)

    def start():
        frame = session.readStream.format("text").load(str(landing))
        return (
            frame.writeStream.foreachBatch(hold)
            .option("checkpointLocation", context.checkpoint)
            .queryName(query_name(context))
            .trigger(processingTime="100 milliseconds")
            .start()
        )

    stream = Stream(session, context, start, RunTotals())
    assert stream_busy(stream) is False  # not started
    query = stream.start()
    try:
        wait_for(lambda: query.status["message"] == "Waiting for data to arrive", 60, "the query to wait")
        assert stream_busy(stream) is False
        (landing / "part-0.txt").write_text("a line\n")
        assert at_work.wait(60), "the query took no batch"
        assert stream_busy(stream) is True
    finally:
        release.set()
        query.stop()
    assert stream_busy(stream) is False  # ended
