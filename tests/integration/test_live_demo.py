"""``make demo`` for real: its live feed and the pipeline's continuous streams under
a real ``airflow standalone``, watched in Debian's chromium. The Watermarks page
refreshes itself as the watermark advances and windows fire; its merge button
triggers ``tidemark_late_merge``, and the quarantine backlog drops to zero. Then
every record the feed sent is reconciled exactly."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
from datetime import datetime
from pathlib import Path

import pytest
from tidemark_airflow import demo
from tidemark_airflow.standalone import USER, Airflow, processes_of, stop, wait

from spark_jobs.config import load_pipeline
from spark_jobs.generator import Manifest, fleet_of, live_records, live_template, malformed_kinds
from spark_jobs.servers import free_port
from spark_jobs.tables import TableRegistry
from tests.integration.browser import DevTools, log_in
from tests.integration.conftest import PIPELINES, assert_bronze_reconciles
from tests.integration.test_late_merge import assert_reconciles, quarantine_by_status

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(2400)]
MERGE_WITHIN_S = 180


def text_of(chromium: DevTools, selector: str) -> str | None:
    return chromium.evaluate(f"document.querySelector({json.dumps(selector)})?.textContent ?? null")


def late_tracks_by_status(spark, registry: TableRegistry) -> dict[str, int]:
    tracks = spark.read.format("delta").load(registry.late_tracks.path)
    return {row.status: row["count"] for row in tracks.groupBy("status").count().collect()}


def feed_pids(home: Path) -> list[int]:
    found = []
    for pid in processes_of(home):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--live" in command and b"generate" in command:
            found.append(pid)
    return found


def stop_feed(home: Path) -> Manifest:
    """SIGTERM to the feed; what it sent, from the counts it prints as it stops."""
    [pid] = feed_pids(home)
    os.kill(pid, signal.SIGTERM)
    wait(lambda: not feed_pids(home), 60, "the feed to stop")
    printed = (home / "feed.log").read_text()
    return Manifest(**json.loads(printed[printed.rfind("\n{") + 1 :]))


def test_the_live_demo_advances_on_the_page_merges_from_its_button_and_reconciles(tmp_path, spark, chromium):
    home, lakehouse, port = tmp_path / "airflow", tmp_path / "lakehouse", free_port()
    registry = TableRegistry(load_pipeline(PIPELINES / "telemetry.yaml"), str(lakehouse))
    try:
        assert demo.main(["--home", str(home), "--lakehouse", str(lakehouse), "--port", str(port)]) == 0
        airflow = Airflow(home, port)
        # Hold the scheduled merges, so the one the page's button triggers is what empties the backlog.
        airflow.request("PATCH", f"/api/v2/dags/{demo.LATE_MERGE}", {"is_paused": True})

        chromium.call("Page.navigate", url=f"{airflow.url}/tidemark/")
        log_in(chromium, USER, airflow.password())
        chromium.wait_for(
            "!!document.querySelector('dd.fired')", "the page with the demo pipeline", timeout=120
        )
        first_fired = text_of(chromium, "dd.fired")
        first_watermark = text_of(chromium, "dd.watermark")
        assert first_fired.startswith("[")
        # No navigation from here on: the page refreshes itself.
        later = chromium.wait_for(
            lambda: (fired := text_of(chromium, "dd.fired")) not in (None, first_fired) and fired,
            "a later window to fire on the page",
            timeout=420,
        )
        watermark = chromium.wait_for(lambda: text_of(chromium, "dd.watermark"), "the watermark")
        assert watermark > first_watermark  # ISO-like: ordered as text
        # The window the page says fired last is in silver, fired (not open).
        start = re.match(r"\[(.+?), ", later).group(1)
        shown = spark.read.format("delta").load(registry.silver.path)
        fired = shown.where(f"window_start = timestamp'{start}' AND status != 'open'")
        assert fired.count() > 0
        states = (
            "[...document.querySelectorAll('table.streams tr[data-stream] .state')].map(s => s.textContent)"
        )
        assert "live" in chromium.wait_for(states, "the streams' states")

        manifest = stop_feed(home)
        assert manifest.records > 0 and manifest.late > 0

        def everything_judged() -> bool:
            bronze = spark.read.format("delta").load(registry.bronze.path).count()
            rejects = spark.read.format("delta").load(registry.ops["rejects"].path).count()
            history = spark.read.format("delta").load(registry.ops["watermark_history"].path)
            judged = history.selectExpr("coalesce(sum(on_time_count + late_count), 0)").first()[0]
            return bronze + rejects == manifest.records and judged == bronze

        wait(everything_judged, 600, "bronze and silver to take in everything the feed sent", every=5)

        # The page's backlog is the larger of the late records and the late tracks the
        # offline stream derives from them; wait until it settles on what the tables hold.
        def backlog_settled() -> bool:
            pending = max(
                quarantine_by_status(spark, registry).get("pending", 0),
                late_tracks_by_status(spark, registry).get("pending", 0),
            )
            shown = chromium.evaluate("document.querySelector('dd.backlog')?.dataset.pending ?? null")
            return pending > 0 and shown == str(pending)

        wait(backlog_settled, 180, "the page's backlog to show the pending late records", every=10)

        # The page held still (no refresh under the click), then its merge button.
        chromium.call("Page.navigate", url=f"{airflow.url}/tidemark/?refresh=0")
        chromium.wait_for("!!document.querySelector('form.merge button')", "the held page")
        chromium.evaluate("document.querySelector('form.merge button').click()")
        chromium.wait_for("!!document.querySelector('.notice.ok a')", "the page to confirm the merge")
        run_id = text_of(chromium, ".notice.ok a")
        airflow.request("PATCH", f"/api/v2/dags/{demo.LATE_MERGE}", {"is_paused": False})
        assert airflow.wait_for_run(demo.LATE_MERGE, run_id) == "success"
        run = airflow.request("GET", f"/api/v2/dags/{demo.LATE_MERGE}/dagRuns/{run_id}")
        assert run["conf"] == {"pipeline": "telemetry"} and run["run_type"] == "manual"
        # Beside the live streams a merge finishes, and soon: one that raced them for what they
        # write ran for minutes or failed after its retries.
        started, ended = (datetime.fromisoformat(run[key]) for key in ("start_date", "end_date"))
        assert (ended - started).total_seconds() <= MERGE_WITHIN_S
        chromium.wait_for(
            "document.querySelector('dd.backlog')?.dataset.pending === '0'",
            "the backlog to drop to zero on the refreshing page",
            timeout=90,
        )
        # The refreshing page keeps a connection to the api-server open, which holds
        # its graceful stop for the whole grace.
        chromium.call("Page.navigate", url="about:blank")
    finally:
        stop(home)

    assert processes_of(home) == []
    assert set(quarantine_by_status(spark, registry)) == {"merged"}
    assert set(late_tracks_by_status(spark, registry)) == {"merged"}
    assert_reconciles(spark, registry)
    fleet = fleet_of(manifest.live_fleet)
    assert fleet == live_template(demo.FLEET, fleet.start_ms)  # the feed sent the demo's fleet
    sent = list(itertools.islice(live_records(fleet, malformed_kinds("files")), manifest.records))
    assert_bronze_reconciles(spark, registry, manifest, sent)
