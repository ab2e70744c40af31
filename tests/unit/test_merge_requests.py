"""Late merges served by a running pipeline application: the request files between a
requester and the application's merge server (``engine.merge_requests``)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from spark_jobs.engine import merge_requests
from spark_jobs.engine.merge_requests import MergeRequest, MergeResult, MergeServer, ask, requests_folder


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    monkeypatch.setattr(merge_requests, "POLL_S", 0.05)
    monkeypatch.setattr(merge_requests, "HEARTBEAT_S", 0.1)
    monkeypatch.setattr(merge_requests, "ALIVE_WITHIN_S", 1.0)
    monkeypatch.setattr(merge_requests, "PICKUP_WITHIN_S", 0.5)


def serving(folder, merge):
    return MergeServer(folder, merge).start()


def test_a_live_server_merges_the_request_and_answers_with_what_it_did(tmp_path):
    asked = []
    server = serving(tmp_path, lambda request: asked.append(request) or "merged 3 late records")
    try:
        answer = ask(tmp_path, MergeRequest("2026-01-01T00:00:00Z", None), within_s=10)
    finally:
        server.stop()

    assert answer == MergeResult(True, "merged 3 late records")
    assert asked == [MergeRequest("2026-01-01T00:00:00Z", None)]
    assert sorted(path.name for path in tmp_path.iterdir()) == []


def test_a_merge_that_fails_in_the_server_is_a_failed_answer_and_the_server_goes_on(tmp_path):
    answers = iter([RuntimeError("conflicts exhausted"), "merged 1 late record"])

    def merge(request):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    server = serving(tmp_path, merge)
    try:
        first, second = ask(tmp_path, MergeRequest(), 10), ask(tmp_path, MergeRequest(), 10)
    finally:
        server.stop()

    assert first == MergeResult(False, "RuntimeError: conflicts exhausted")
    assert second == MergeResult(True, "merged 1 late record")


def test_without_a_server_the_requester_merges_itself_at_once(tmp_path):
    started = time.monotonic()
    assert ask(tmp_path, MergeRequest(), within_s=10) is None
    assert time.monotonic() - started < 0.2
    assert list(tmp_path.iterdir()) == []


def test_a_stale_heartbeat_counts_as_no_server(tmp_path):
    (tmp_path / "alive").write_text(json.dumps({"at": time.time() - 5}))
    assert ask(tmp_path, MergeRequest(), within_s=10) is None
    assert [path.name for path in tmp_path.iterdir()] == ["alive"]


def test_a_request_no_server_takes_up_is_withdrawn_and_left_to_the_requester(tmp_path):
    # A heartbeat, but no thread taking requests (a server stuck elsewhere).
    (tmp_path / "alive").write_text(json.dumps({"at": time.time() + 60}))

    assert ask(tmp_path, MergeRequest(), within_s=10) is None
    assert [path.name for path in tmp_path.iterdir()] == ["alive"]


def test_a_server_that_stops_beating_mid_merge_leaves_the_merge_to_the_requester(tmp_path):
    release = threading.Event()
    server = MergeServer(tmp_path, lambda request: release.wait(10) and "late")
    server._say_alive()
    server.threads[0].start()  # it serves, but its heartbeat thread never runs (a dying process)
    try:
        started = time.monotonic()
        answer = ask(tmp_path, MergeRequest(), within_s=10)
        waited = time.monotonic() - started
    finally:
        release.set()
        server.stopping.set()
        server.threads[0].join()
    assert answer is None
    assert waited < 5  # the stale heartbeat ended the wait, not the 10 s bound


def test_a_server_beats_through_a_long_merge(tmp_path):
    server = serving(tmp_path, lambda request: time.sleep(2 * merge_requests.ALIVE_WITHIN_S) or "slow")
    try:
        answer = ask(tmp_path, MergeRequest(), within_s=10)
    finally:
        server.stop()
    assert answer == MergeResult(True, "slow")


def test_merges_are_served_only_from_a_lakehouse_on_a_file_system(tmp_path):
    assert requests_folder(str(tmp_path), "telemetry") == tmp_path / "_checkpoints/telemetry/merge-requests"
    assert (
        requests_folder(f"file:{tmp_path}", "telemetry") == tmp_path / "_checkpoints/telemetry/merge-requests"
    )
    assert requests_folder("s3a://bucket/lake", "telemetry") is None
