"""The Tidemark page under a real ``airflow standalone``: registered in the UI's
navigation, refused without a login, served to a bearer token from
``POST /auth/token``, to the cookie the UI's login sets, and to a headless
Chromium that logs in through the UI's form. The REST API refuses anonymous and
forged callers too."""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import jwt
import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql.types import ArrayType, DataType, StructType
from tidemark_airflow.lakehouse import MAX_WATERMARK, MIN_WATERMARK
from tidemark_airflow.standalone import USER

from spark_jobs.config import load_pipeline
from spark_jobs.tables import TableRef, TableRegistry
from tests.integration.airflow_standalone import Standalone, airflow_standalone, processes_of
from tests.integration.browser import log_in

pytestmark = pytest.mark.slow

PIPELINES = Path(__file__).resolve().parents[2] / "spark_jobs" / "pipelines"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
ARROW_TYPES = {
    "string": pa.string(),
    "bigint": pa.int64(),
    "int": pa.int32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}


def arrow_type(data_type: DataType) -> pa.DataType:
    if isinstance(data_type, ArrayType):
        return pa.list_(arrow_type(data_type.elementType))
    if isinstance(data_type, StructType):
        return pa.struct(pa.field(f.name, arrow_type(f.dataType), f.nullable) for f in data_type.fields)
    return ARROW_TYPES[data_type.simpleString()]


def write(table: TableRef, rows: list[dict[str, Any]]) -> None:
    """Rows into the table's Delta location with the registry's schema. Written
    without Spark: the page only reads, and the reader's Spark compatibility is
    tested in tests/unit/test_lakehouse_reader.py."""
    schema = pa.schema(
        pa.field(field.name, arrow_type(field.dataType), field.nullable) for field in table.schema.fields
    )
    filled = [{name: row.get(name) for name in schema.names} for row in rows]
    write_deltalake(table.path, pa.Table.from_pylist(filled, schema), partition_by=list(table.partition_by))


@pytest.fixture(scope="module")
def lakehouse_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lakehouse")
    registry = TableRegistry(load_pipeline(PIPELINES / "telemetry.yaml"), str(root))
    ops = registry.ops
    # The clocks of the last judged bronze version, 2: the history's last step.
    clock = {"pipeline": "telemetry", "is_idle": False, "is_aligned": True, "updated_at": T0, "batch_id": 2}
    write(
        ops["watermarks"],
        [
            {**clock, "source_partition": "0", "partition_watermark": 1_772_366_390_000, "last_data_at": T0},
            {**clock, "source_partition": "1", "partition_watermark": MIN_WATERMARK},
            {**clock, "source_partition": "2", "partition_watermark": 1_772_366_380_000, "is_idle": True},
        ],
    )
    step = {"pipeline": "telemetry", "active_partitions": 2, "idle_partitions": 1}
    write(
        ops["watermark_history"],
        [
            {**step, "batch_id": b, "watermark": w, "on_time_count": 5, "late_count": 1}
            | {"processing_time": T0 + timedelta(seconds=10 * b)}
            for b, w in enumerate([MIN_WATERMARK, 1_772_366_340_000, 1_772_366_385_000])
        ],
    )
    write(
        ops["runs"],
        [
            {
                "run_id": "merge-1",
                "job": "merge_late",
                "pipeline": "telemetry",
                "status": "succeeded",
                "rows_in": 4,
                "rows_out": 3,
                "started_at": T0,
                "ended_at": T0 + timedelta(seconds=9),
                "duration_ms": 9_000,
            }
        ],
    )
    late = {
        "device_id": "d1",
        "event_id": "f:1",
        "source_offset": 1,
        "event_time": T0,
        "ingest_time": T0,
        "processing_time": T0,
        "window_start": T0,
        "window_end": T0,
        "watermark": MAX_WATERMARK,
        "lateness_ms": 1,
        "reason": "window_cleaned",
        "quarantined_at": T0,
    }
    write(
        registry.quarantine,
        [
            {**late, "source_partition": "0", "status": "pending"},
            {**late, "source_partition": "2", "status": "pending"},
            {**late, "source_partition": "2", "status": "merged"},
        ],
    )
    return root


@pytest.fixture(scope="module")
def airflow(tmp_path_factory, lakehouse_dir) -> Iterator[Standalone]:
    home = tmp_path_factory.mktemp("airflow-home")
    with airflow_standalone(home, lakehouse_dir) as standalone:
        yield standalone
    assert standalone.leftovers == [], "processes outlived the standalone's process group"
    assert processes_of(standalone.home) == []


def get(airflow: Standalone, path: str, **kwargs: Any) -> httpx.Response:
    return httpx.get(airflow.url + path, timeout=60, follow_redirects=False, **kwargs)


def bearer(airflow: Standalone) -> dict[str, str]:
    return {"Authorization": f"Bearer {airflow.token()}"}


def partition_rows(page: str) -> dict[str, str]:
    """Partition -> the text of its row in the telemetry watermark table."""
    table = re.search(r'<table class="clocks" data-pipeline="telemetry">(.*?)</table>', page, re.S)
    assert table, page[:2000]
    rows = re.findall(r'<tr data-partition="([^"]+)">(.*?)</tr>', table.group(1), re.S)
    return {partition: re.sub(r"<[^>]+>", " ", cells) for partition, cells in rows}


def test_the_page_is_in_the_ui_navigation(airflow):
    plugins = get(airflow, "/api/v2/plugins", headers=bearer(airflow)).json()["plugins"]
    [tidemark] = [plugin for plugin in plugins if plugin["name"] == "tidemark"]
    assert [app["url_prefix"] for app in tidemark["fastapi_apps"]] == ["/tidemark"]
    [view] = tidemark["external_views"]
    assert view["url_route"] == "tidemark" and view["destination"] == "nav"
    assert get(airflow, "/" + view["icon"]).headers["content-type"].startswith("image/svg+xml")


def test_the_spark_connection_is_stored_where_admin_connections_lists_it(airflow):
    listed = get(airflow, "/api/v2/connections", headers=bearer(airflow)).json()["connections"]
    [spark] = [connection for connection in listed if connection["connection_id"] == "tidemark_spark"]
    assert (spark["conn_type"], spark["host"]) == ("spark", "local[2]")


def test_the_page_is_refused_without_a_login(airflow):
    for path in ("/tidemark/", "/tidemark/api/pipelines"):
        anonymous = get(airflow, path)
        assert anonymous.status_code == 401, path
        forged = get(airflow, path, headers={"Authorization": "Bearer not-a-jwt"})
        assert forged.status_code in (401, 403), path
        stale_cookie = get(airflow, path, cookies={"_token": "not-a-jwt"})
        assert stale_cookie.status_code in (401, 403), path
        for refused in (anonymous, forged, stale_cookie):
            assert "data-partition" not in refused.text and "1772366" not in refused.text
    browser = get(airflow, "/tidemark/", headers={"Accept": "text/html,application/xhtml+xml"})
    assert browser.status_code == 303
    assert browser.headers["location"].startswith("/auth/login")
    assert "data-partition" not in browser.text


def forged_tokens() -> dict[str, str]:
    """Admin claims as an attacker could sign them: unsigned, or with a guessed secret."""
    now = int(time.time())
    claims = {
        "sub": USER,
        "role": "admin",
        "teams": [],
        "aud": "apache-airflow",
        "iat": now,
        "exp": now + 600,
    }
    return {
        "unsigned": jwt.encode(claims, None, algorithm="none"),
        **{
            f"signed with {secret!r}": jwt.encode(claims, secret, algorithm="HS512")
            for secret in ("secret", "admin")
        },
    }


@pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")  # guessed secrets are short
def test_the_rest_api_refuses_callers_without_a_valid_token(airflow):
    """Reads and writes alike (the writes name nothing that exists, so a hole could
    not change the instance), anonymous or with forged tokens; no default password."""
    calls = [
        ("GET", "/api/v2/dags"),
        ("GET", "/api/v2/connections"),
        ("GET", "/api/v2/variables"),
        ("GET", "/api/v2/config"),
        ("POST", "/api/v2/dags/no_such_dag/dagRuns"),
        ("PATCH", "/api/v2/dags/no_such_dag"),
        ("DELETE", "/api/v2/connections/no_such_connection"),
    ]
    for method, path in calls:
        anonymous = httpx.request(method, airflow.url + path, json={}, timeout=60)
        assert anonymous.status_code == 401, (method, path, anonymous.status_code)
        for how, token in forged_tokens().items():
            forged = httpx.request(
                method, airflow.url + path, json={}, headers={"Authorization": f"Bearer {token}"}, timeout=60
            )
            assert forged.status_code in (401, 403), (method, path, how, forged.status_code)
    for password in ("admin", "", "password"):
        login = httpx.post(
            airflow.url + "/auth/token", json={"username": USER, "password": password}, timeout=60
        )
        assert login.status_code in (400, 401, 403), (password, login.status_code)
        assert "access_token" not in login.text
    # The control: the same call with the token from the real password is served.
    assert get(airflow, "/api/v2/dags", headers=bearer(airflow)).status_code == 200


def test_a_bearer_token_from_the_api_gets_the_watermark_table(airflow):
    page = get(airflow, "/tidemark/", headers=bearer(airflow))
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    rows = partition_rows(page.text)
    assert list(rows) == ["0", "1", "2"]
    assert "2026-03-01 11:59:50.000" in rows["0"] and "5 s ahead" in rows["0"]
    assert "\u2212\u221e" in rows["1"]  # never had data: -inf
    assert "idle" in rows["2"] and "5 s behind" in rows["2"]
    assert "2 late" in page.text  # pending quarantine rows; the merged one is not counted
    assert "<svg" in page.text and '<table class="merges">' in page.text

    [telemetry] = [
        p
        for p in get(airflow, "/tidemark/api/pipelines", headers=bearer(airflow)).json()
        if p["pipeline"] == "telemetry"
    ]
    assert telemetry["watermark"] == 1_772_366_385_000
    assert [c["source_partition"] for c in telemetry["partitions"]] == ["0", "1", "2"]
    assert telemetry["backlog"] == {"late": {"0": 1, "2": 1}}
    assert [run["run_id"] for run in telemetry["merges"]] == ["merge-1"]


def test_the_cookie_set_by_the_ui_login_gets_the_page(airflow):
    # The UI's login form stores the token from /auth/token in the `_token` cookie.
    page = get(airflow, "/tidemark/", cookies={"_token": airflow.token()})
    assert page.status_code == 200
    assert list(partition_rows(page.text)) == ["0", "1", "2"]


def test_the_page_refreshes_itself_and_offers_a_merge_and_its_runs(airflow):
    page = get(airflow, "/tidemark/", cookies={"_token": airflow.token()}).text
    assert '<meta http-equiv="refresh" content="10">' in page
    assert '<form class="merge" method="post" action="pipelines/telemetry/merge">' in page
    # The other shipped pipeline has no data: one line, not a section.
    assert '<li data-pipeline="clickstream">' in page and 'id="pipeline-clickstream"' not in page


def test_the_merge_button_triggers_the_late_merge_as_the_caller(airflow):
    cookie = {"_token": airflow.token()}
    posted = httpx.post(
        f"{airflow.url}/tidemark/pipelines/telemetry/merge",
        cookies=cookie,
        headers={"Origin": airflow.url},
        follow_redirects=False,
        timeout=60,
    )
    assert posted.status_code == 303
    location = posted.headers["location"]
    assert location.startswith("../../?merged=telemetry&run=")
    run_id = unquote(location.split("run=", 1)[1])
    run = airflow.client.request("GET", f"/api/v2/dags/tidemark_late_merge/dagRuns/{run_id}")
    assert run["conf"] == {"pipeline": "telemetry"}
    page = get(airflow, f"/tidemark/{location.removeprefix('../../')}", cookies=cookie).text
    assert "Late merge triggered for telemetry" in page and "/runs/" in page


def test_the_merge_button_refuses_other_sites_and_strangers(airflow):
    url = f"{airflow.url}/tidemark/pipelines/telemetry/merge"
    cookie = {"_token": airflow.token()}
    forged = httpx.post(url, cookies=cookie, headers={"Origin": "https://evil.example"}, timeout=60)
    assert forged.status_code == 403
    cross_site = httpx.post(url, cookies=cookie, headers={"Sec-Fetch-Site": "cross-site"}, timeout=60)
    assert cross_site.status_code == 403
    assert httpx.post(url, headers={"Origin": airflow.url}, timeout=60).status_code == 401
    unknown = httpx.post(
        f"{airflow.url}/tidemark/pipelines/nosuch/merge",
        cookies=cookie,
        headers={"Origin": airflow.url},
        timeout=60,
    )
    assert unknown.status_code == 404


def has_watermark_table(node: dict[str, Any]) -> bool:
    attributes = node.get("attributes", [])
    if node.get("nodeName") == "TABLE" and "clocks" in attributes:
        return True
    children = [*node.get("children", []), *([node["contentDocument"]] if "contentDocument" in node else [])]
    return any(has_watermark_table(child) for child in children)


def test_a_browser_logs_in_through_the_ui_and_sees_the_page(airflow, chromium, tmp_path):
    chromium.call("Page.navigate", url=f"{airflow.url}/tidemark/")
    log_in(chromium, airflow.username, airflow.password)
    # Back from the login to the page it was asked for, now with the data.
    chromium.wait_for(
        "location.pathname === '/tidemark/' && !!document.querySelector('table.clocks')", "the page"
    )
    partitions = chromium.evaluate(
        "[...document.querySelectorAll('table.clocks[data-pipeline=telemetry] tr[data-partition]')]"
        ".map(row => row.dataset.partition)"
    )
    assert partitions == ["0", "1", "2"]

    # The navigation entry: Airflow's UI frames the page.
    chromium.call("Page.navigate", url=f"{airflow.url}/plugin/tidemark")
    chromium.call("DOM.enable")
    framed = chromium.wait_for(
        lambda: has_watermark_table(chromium.call("DOM.getDocument", depth=-1, pierce=True)["root"]),
        "the watermark table inside the UI's plugin frame",
    )
    screenshot = chromium.call("Page.captureScreenshot")["data"]
    (tmp_path / "tidemark-in-airflow.png").write_bytes(base64.b64decode(screenshot))
    assert framed


def test_a_run_link_on_the_framed_page_opens_the_run_in_the_ui_not_inside_the_frame(airflow, chromium):
    # Paused DAG: the run stays queued, listed on the page, and runs nothing.
    run_id = airflow.client.trigger("tidemark_late_merge", {"pipeline": "telemetry"})
    run_path = f"/dags/tidemark_late_merge/runs/{run_id}"
    chromium.call("Page.navigate", url=f"{airflow.url}/auth/login")
    log_in(chromium, airflow.username, airflow.password)
    chromium.wait_for("location.pathname !== '/auth/login'", "the login to finish")

    chromium.call("Page.navigate", url=f"{airflow.url}/plugin/tidemark")
    selector = json.dumps(f'a.dag-run[href$="{run_id}"]')
    link = f"document.querySelector('iframe')?.contentDocument?.querySelector({selector})"
    # Found and clicked in one go: the framed page reloads itself every few seconds.
    clicked = f"(() => {{ const link = {link}; link?.click(); return !!link; }})()"
    chromium.wait_for(clicked, "the run's link on the framed page")
    # The UI itself shows the run: its own address, its own page, no frame around it.
    chromium.wait_for(f"location.pathname === {run_path!r}", "the UI to route to the run")
    chromium.wait_for(
        f"!document.querySelector('iframe') && document.body.innerText.includes({run_id!r})",
        "the UI's page of the run",
    )


def trigger_form(airflow, chromium, dag_id: str, param: str) -> str:
    """The text of ``dag_id``'s trigger form in the UI, once it shows ``param``."""
    airflow.client.wait_for_dags([dag_id])
    chromium.call("Page.navigate", url=f"{airflow.url}/auth/login")
    log_in(chromium, airflow.username, airflow.password)
    chromium.wait_for("location.pathname !== '/auth/login'", "the login to finish")

    chromium.call("Page.navigate", url=f"{airflow.url}/dags/{dag_id}")
    trigger = "[...document.querySelectorAll('button')].find(b => b.textContent.trim() === 'Trigger')"
    chromium.wait_for(f"!!({trigger})", "the DAG page's Trigger button")
    chromium.evaluate(f"({trigger}).click()")
    # The DAG page has other dialogs (grid options); the trigger form is the one titled so.
    form_text = (
        "[...document.querySelectorAll('[role=dialog]')].map(d => d.innerText)"
        ".find(text => text.startsWith('Trigger Dag')) ?? ''"
    )
    chromium.wait_for(f"({form_text}).includes({param!r})", f"the trigger form with the {param} Param")
    return chromium.evaluate(form_text)


def test_the_late_merge_trigger_form_offers_its_params(airflow, chromium):
    shown = trigger_form(airflow, chromium, "tidemark_late_merge", "dry_run")
    for param in ("pipeline", "dry_run", "from", "to"):
        assert f"\n{param}\n" in shown, f"the trigger form lacks the {param!r} Param"
    assert "print what would change; write nothing" in shown


def test_the_streaming_trigger_form_offers_the_jvm_profile(airflow, chromium):
    shown = trigger_form(airflow, chromium, "tidemark_streaming", "jvm_profile")
    for param in ("pipeline", "mode", "interval", "one_application", "jvm_profile"):
        assert f"\n{param}\n" in shown, f"the trigger form lacks the {param!r} Param"
    assert "else short-jobs for continuous streams and throughput for the rest" in shown
    assert "\njvm_profile\nthe workers' default\n" in shown  # the empty choice, named
