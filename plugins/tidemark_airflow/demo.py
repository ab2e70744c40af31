"""``make demo``: the demo pipeline live under a real ``airflow standalone``.

A feed (``tidemark generate --live``) lands current scooter telemetry in the
``telemetry`` pipeline's landing zone every second, with late uploads, a
partition that goes dark (and idle) every other few minutes and malformed records. Airflow
supervises the pipeline's four streams, running continuously as one Spark
application (``tidemark_streaming`` in continuous mode), and its late merge runs
once late records have accumulated. The demo returns once silver has judged the
first records, printing where to look; everything keeps running until ``make stop``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from spark_jobs.generator import LIVE_LEAD_MS, FleetSpec
from spark_jobs.object_store import S3Server, is_object_store
from tidemark_airflow.lakehouse import is_finite, pipeline_watermark
from tidemark_airflow.standalone import LAKEHOUSE, REPO, USER, Airflow, start, stop, wait

PIPELINE = "telemetry"
# 20 records a second: 40 scooters, a track every 2 s; one partition goes dark every other segment.
FLEET = FleetSpec(devices=40, interval_ms=2_000, late_ratio=0.02, malformed_ratio=0.01, quiet_partitions=1)
STREAMING = ("tidemark_streaming", {"pipeline": PIPELINE, "mode": "continuous", "interval": "5s"})
LATE_MERGE = "tidemark_late_merge"
RUNNING = {"queued", "running"}
SAMPLE_QUERY = "SELECT * FROM silver.telemetry_windows ORDER BY window_start DESC LIMIT 5"


def start_feed(home: Path, lakehouse: str) -> subprocess.Popen:
    """The live feed in a session of its own, marked with Airflow's home, so that
    ``make stop`` (which stops every process carrying it) stops the feed too."""
    return subprocess.Popen(
        [
            str(Path(sys.executable).with_name("tidemark")),
            *("generate", "--live", "--pipeline", PIPELINE, "--lakehouse", str(lakehouse)),
            *feed_arguments(FLEET),
        ],
        env={**os.environ, "AIRFLOW_HOME": str(home.resolve())},
        stdout=(home / "feed.log").open("ab"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def feed_arguments(fleet: FleetSpec) -> list[str]:
    """The ``tidemark generate`` arguments that make ``fleet``."""
    return [
        *("--devices", str(fleet.devices), "--partitions", str(fleet.partitions), "--seed", str(fleet.seed)),
        *("--interval", f"{fleet.interval_ms}ms", "--quiet-partitions", str(fleet.quiet_partitions)),
        *("--late-ratio", str(fleet.late_ratio), "--malformed-ratio", str(fleet.malformed_ratio)),
    ]


def start_object_store(home: Path, port: int) -> S3Server:
    """The demo's S3 server, its data beside Airflow's home, marked with that home so
    that ``make stop`` stops it too; this process's environment then reaches it, and
    so do the feed's and Airflow's, which inherit it."""
    server = S3Server(home.parent / "s3", port=port).start(environment={"AIRFLOW_HOME": str(home.resolve())})
    os.environ.update(server.environment())
    return server


def wait_until_judged(airflow: Airflow, run_id: str, lakehouse: str, since_ms: int, timeout: float) -> None:
    """Until silver's watermark reaches ``since_ms``: the streams have judged the
    feed's data (a lakehouse kept from an earlier demo has an older watermark)."""

    def judged() -> bool:
        state = airflow.run_state(STREAMING[0], run_id)
        if state not in RUNNING:
            raise RuntimeError(f"{STREAMING[0]} run {run_id} ended {state}: see its task log in the UI")
        watermark = pipeline_watermark(lakehouse, PIPELINE)
        return is_finite(watermark) and watermark >= since_ms

    wait(judged, timeout, "silver's first watermark", every=3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tidemark_airflow.demo")
    parser.add_argument("--home", type=Path, default=REPO / ".tidemark" / "airflow")
    parser.add_argument(
        "--lakehouse", help=f"default: {LAKEHOUSE}, or s3a://lake/lakehouse with --object-store"
    )
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--object-store",
        action="store_true",
        help="keep the lakehouse on a SeaweedFS S3 server on loopback (data in .tidemark/s3)",
    )
    parser.add_argument("--s3-port", type=int, default=8333)
    args = parser.parse_args(argv)

    started = time.monotonic()
    # A clean Airflow, keeping the lakehouse: an earlier demo's stream run, killed by
    # `make stop`, would still be running in Airflow's database and hold the new one queued.
    stop(args.home)
    (args.home / "airflow.db").unlink(missing_ok=True)
    args.home.mkdir(parents=True, exist_ok=True)
    server = start_object_store(args.home, args.s3_port) if args.object_store else None
    lakehouse = args.lakehouse or (f"s3a://{server.bucket}/lakehouse" if server else str(LAKEHOUSE))
    if not is_object_store(lakehouse):
        Path(lakehouse).mkdir(parents=True, exist_ok=True)
    # Live once silver has judged the feed's data: its watermark passes where the feed
    # starts and where a lakehouse kept from an earlier demo left it.
    before = pipeline_watermark(lakehouse, PIPELINE)
    live_from_ms = max(int(time.time() * 1000) - LIVE_LEAD_MS, before + 1 if is_finite(before) else 0)
    feed = start_feed(args.home, lakehouse)
    print(f"feeding live telemetry into {lakehouse} (log: {args.home / 'feed.log'})", flush=True)
    try:
        airflow = start(args.home, lakehouse, args.port)
        print(f"Airflow is up at {airflow.url}", flush=True)
        airflow.wait_for_dags([STREAMING[0], LATE_MERGE])
        airflow.unpause(LATE_MERGE)
        airflow.unpause(STREAMING[0])
        run_id = airflow.trigger(*STREAMING)
        print(f"started {STREAMING[0]} in continuous mode ({run_id}); waiting for silver ...", flush=True)
        wait_until_judged(airflow, run_id, lakehouse, live_from_ms, timeout=600)
    except BaseException:
        print(f"The demo did not come up; stopping what it started (logs in {args.home}).", file=sys.stderr)
        stop(args.home)
        feed.kill()
        if server is not None:
            server.stop()
        raise
    print(f"\nLive after {time.monotonic() - started:.0f} s. It keeps running until `make stop`.\n")
    print(f"Airflow UI:   {airflow.url}  (user {USER}, password {airflow.password()})")
    print(f"Watermarks:   {airflow.url}/plugin/tidemark  (the 'Watermarks' entry in the UI's navigation)")
    print(f"Lakehouse:    {lakehouse}")
    if server is not None:
        settings = " ".join(f"{key}={value}" for key, value in server.environment().items())
        print(f"S3 server:    {server.endpoint}; other commands need: export {settings}")
    print(f"SQL:          make sql-server, then .venv/bin/tidemark sql {SAMPLE_QUERY!r}")
    print("Stop it with: make stop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
