"""The REST client of the standalone and the page's merge button: server errors are
retried, a retried trigger never starts a second run, and a refusal says why."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from tidemark_airflow import rest
from tidemark_airflow.standalone import PASSWORDS_FILE, USER, Airflow

BASE = "/airflow"
CLIENT_TIMEOUT_S, STALL_S = 0.2, 0.6


class FlakyAirflow(BaseHTTPRequestHandler):
    """Answers like Airflow's api-server whose first ``failures`` answers to the
    dagRuns POST are 500s, each after the run was created (a commit, then a lock), or
    whose first ``locked`` answers are 500s before anything was created."""

    failures = 0
    locked = 0
    runs: list[str] = []
    posts = 0
    gets = 0
    stalls = 0

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/auth/token":
            return self.answer(201, {"access_token": "token"})
        type(self).posts += 1
        # The standalone serves at its root; the page passes Airflow's base path along.
        if self.path not in (
            "/api/v2/dags/tidemark_late_merge/dagRuns",
            f"{BASE}/api/v2/dags/tidemark_late_merge/dagRuns",
        ):
            return self.answer(404, {"detail": f"no route {self.path}"})
        if type(self).locked:
            type(self).locked -= 1
            return self.answer(500, {"detail": "database is locked"})
        if body["dag_run_id"] in self.runs:
            return self.answer(409, {"detail": "exists"})
        self.runs.append(body["dag_run_id"])
        if type(self).failures:
            type(self).failures -= 1
            return self.answer(500, {"detail": "database is locked"})
        return self.answer(200, {"dag_run_id": body["dag_run_id"]})

    def do_GET(self) -> None:
        type(self).gets += 1
        if self.path == "/api/v2/monitor/broken":
            return self.answer(503, {"detail": "down"})
        if self.path == "/api/v2/monitor/slow":
            if type(self).stalls:
                type(self).stalls -= 1
                time.sleep(STALL_S)
            return self.answer(200, {"status": "healthy"})
        return self.answer(404, {"detail": "not found"})

    def answer(self, code: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def airflow(tmp_path, monkeypatch) -> Iterator[Airflow]:
    monkeypatch.setattr(rest, "SERVER_ERROR_PAUSE_S", 0.01)
    FlakyAirflow.failures, FlakyAirflow.locked, FlakyAirflow.runs = 0, 0, []
    FlakyAirflow.posts, FlakyAirflow.gets, FlakyAirflow.stalls = 0, 0, 0
    monkeypatch.setattr(rest, "TIMEOUT_S", CLIENT_TIMEOUT_S)
    (tmp_path / PASSWORDS_FILE).write_text(json.dumps({USER: "secret"}))
    server = ThreadingHTTPServer(("127.0.0.1", 0), FlakyAirflow)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Airflow(tmp_path, server.server_address[1])
    finally:
        server.shutdown()


def test_a_trigger_answered_500_after_creating_its_run_is_retried_into_that_one_run(airflow):
    FlakyAirflow.failures = 1
    run_id = airflow.trigger("tidemark_late_merge", {})
    assert FlakyAirflow.runs == [run_id]
    assert FlakyAirflow.posts == 2


def test_a_trigger_refused_on_every_attempt_says_airflows_reason(airflow):
    FlakyAirflow.locked = rest.SERVER_ERROR_ATTEMPTS
    with pytest.raises(urllib.error.HTTPError) as raised:
        rest.trigger(f"{airflow.url}{BASE}/", "tidemark_late_merge", {"pipeline": "p"}, "token")
    assert rest.refusal(raised.value) == "HTTP 500: database is locked"
    assert FlakyAirflow.runs == []


def test_a_trigger_locked_out_at_first_then_let_in_starts_one_run(airflow):
    FlakyAirflow.locked = 2
    run_id = rest.trigger(f"{airflow.url}{BASE}/", "tidemark_late_merge", {"pipeline": "p"}, "token")
    assert FlakyAirflow.runs == [run_id] and FlakyAirflow.posts == 3


def test_an_unreachable_airflow_is_named_as_the_reason():
    with pytest.raises(urllib.error.URLError) as raised:
        rest.trigger(f"http://127.0.0.1:9{BASE}/", "tidemark_late_merge", {}, None)
    assert "refused" in rest.refusal(raised.value).lower()


def test_a_server_error_that_persists_is_raised_after_a_few_attempts(airflow):
    with pytest.raises(urllib.error.HTTPError) as raised:
        airflow.request("GET", "/api/v2/monitor/broken", token=None)
    assert raised.value.code == 503
    assert FlakyAirflow.gets == rest.SERVER_ERROR_ATTEMPTS


def test_client_errors_are_not_retried(airflow):
    with pytest.raises(urllib.error.HTTPError) as raised:
        airflow.request("GET", "/api/v2/dags/nope", token=None)
    assert raised.value.code == 404
    assert FlakyAirflow.gets == 1


def test_a_call_left_unanswered_past_the_timeout_is_retried_until_answered(airflow):
    FlakyAirflow.stalls = 2
    assert airflow.request("GET", "/api/v2/monitor/slow", token=None) == {"status": "healthy"}
    assert FlakyAirflow.gets == 3


def test_a_call_that_times_out_on_every_attempt_is_raised_after_a_few(airflow):
    FlakyAirflow.stalls = rest.SERVER_ERROR_ATTEMPTS
    with pytest.raises(TimeoutError):
        airflow.request("GET", "/api/v2/monitor/slow", token=None)
    assert FlakyAirflow.gets == rest.SERVER_ERROR_ATTEMPTS
