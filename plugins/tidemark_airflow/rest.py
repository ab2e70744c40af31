"""Calls to Airflow's REST API, shared by the page's merge button and the standalone client.

On SQLite the api-server answers 500 when the scheduler holds the database longer than its
busy timeout, and on a loaded machine it can leave a call unanswered past the client's
timeout: a server error and a timeout are retried. A new run's id is chosen here, so a retried POST
whose first attempt did create the run finds it (409) instead of starting a second one.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from datetime import datetime
from http import HTTPStatus
from typing import Any

SERVER_ERROR_ATTEMPTS, SERVER_ERROR_PAUSE_S = 5, 2.0
TIMEOUT_S = 30


def call(url: str, method: str, body: Any = None, token: str | None = None) -> Any:
    """JSON in and out of ``url``; a server error or a timeout is retried a few times, then raised."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    attempt = 1
    while True:
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                payload = response.read()
            return json.loads(payload) if payload else None
        except urllib.error.HTTPError as error:
            if error.code < HTTPStatus.INTERNAL_SERVER_ERROR or attempt == SERVER_ERROR_ATTEMPTS:
                raise
        except (TimeoutError, urllib.error.URLError) as error:
            timed_out = isinstance(error, TimeoutError) or isinstance(error.reason, TimeoutError)
            if not timed_out or attempt == SERVER_ERROR_ATTEMPTS:
                raise
        time.sleep(SERVER_ERROR_PAUSE_S * attempt)
        attempt += 1


def trigger(
    root: str,
    dag_id: str,
    conf: Mapping[str, Any] | None,
    token: str | None,
    logical_date: datetime | None = None,
) -> str:
    """The id of a new run of ``dag_id`` on the Airflow at ``root`` (its URL, with its base
    path), for ``logical_date`` (else none)."""
    run_id = f"manual__tidemark_{uuid.uuid4().hex}"
    moment = None if logical_date is None else logical_date.isoformat()
    body = {"dag_run_id": run_id, "logical_date": moment, "conf": dict(conf or {})}
    try:
        call(f"{root.rstrip('/')}/api/v2/dags/{dag_id}/dagRuns", "POST", body, token)
    except urllib.error.HTTPError as error:
        if error.code != HTTPStatus.CONFLICT:  # an earlier attempt of this very POST created it
            raise
    return run_id


def refusal(error: Exception) -> str:
    """Why a call failed, in a few words: Airflow's own detail where it gave one."""
    if isinstance(error, urllib.error.HTTPError):
        try:
            detail = json.loads(error.read() or b"{}").get("detail")
        except (ValueError, AttributeError):
            detail = None
        return f"HTTP {error.code}" + (f": {detail}" if isinstance(detail, str) and detail else "")
    if isinstance(error, urllib.error.URLError):
        return str(error.reason)
    return str(error) or type(error).__name__
