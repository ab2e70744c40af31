"""``make demo``: the whole pipeline under a real ``airflow standalone``.

Generates scooter telemetry (with late uploads and malformed records) into the
demo pipeline's landing zone, starts Airflow with the repository's DAGs and
plugin, runs the streaming DAG (available-now), a late merge and an idleness
check through Airflow's REST API, as a person would from the UI, and prints
where to look and a row count per table. ``make stop`` stops Airflow.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from tidemark_airflow.standalone import LAKEHOUSE, REPO, USER, Airflow, start, stop

PIPELINE = REPO / "spark_jobs" / "pipelines" / "telemetry.yaml"
STREAMING = ("tidemark_streaming", {"pipeline": "telemetry", "mode": "available-now"})
LATE_MERGE = ("tidemark_late_merge", {"pipeline": "telemetry"})
IDLENESS_CHECK = ("tidemark_idleness_check", {"pipeline": "telemetry", "stall_after": "1h"})


def tidemark(*args: str, quiet: bool = False) -> None:
    output = subprocess.DEVNULL if quiet else None
    subprocess.run([str(Path(sys.executable).with_name("tidemark")), *args], check=True, stdout=output)


def run_dag(airflow: Airflow, dag_id: str, conf: dict) -> bool:
    airflow.unpause(dag_id)
    run_id = airflow.trigger(dag_id, conf)
    print(f"triggered {dag_id} ({run_id}) ...", flush=True)
    state = airflow.wait_for_run(dag_id, run_id)
    print(f"  {dag_id}: {state}", flush=True)
    return state == "success"


def generate(lakehouse: str, devices: str, seed: str) -> None:
    tidemark(
        "generate",
        *("--pipeline", str(PIPELINE), "--lakehouse", lakehouse, "--devices", devices, "--seed", seed),
        *("--duration", "2h", "--late-ratio", "0.02", "--malformed-ratio", "0.01"),
        quiet=True,  # the manifest lists every file; the table counts below say enough
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tidemark_airflow.demo")
    parser.add_argument("--home", type=Path, default=REPO / ".tidemark" / "airflow")
    parser.add_argument("--lakehouse", type=Path, default=LAKEHOUSE)
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--devices", default="20")
    args = parser.parse_args(argv)

    stop(args.home)  # a demo starts from a clean Airflow, keeping the lakehouse
    lakehouse = str(args.lakehouse)
    generate(lakehouse, args.devices, "0")
    airflow = start(args.home, args.lakehouse, args.port)
    print(f"Airflow is up at {airflow.url}", flush=True)
    airflow.wait_for_dags([STREAMING[0], LATE_MERGE[0], IDLENESS_CHECK[0]])
    ok = run_dag(airflow, *STREAMING)
    # A second fleet uploads the same two hours after they closed in event time:
    # its records land in the quarantine, and the late merge folds them in.
    generate(lakehouse, "5", "1")
    ok = run_dag(airflow, *STREAMING) and ok
    ok = run_dag(airflow, *LATE_MERGE) and ok
    ok = run_dag(airflow, *IDLENESS_CHECK) and ok
    print()
    print(f"Airflow UI:   {airflow.url}  (user {USER}, password {airflow.password()})")
    print("Watermarks:   the 'Watermarks' entry in the UI's navigation")
    print(f"Lakehouse:    {lakehouse}")
    print('SQL:          make sql-server, then .venv/bin/tidemark sql "SHOW TABLES IN silver"')
    print("Stop it with: make stop")
    print()
    tidemark("tables", "--pipeline", str(PIPELINE), "--lakehouse", lakehouse, "--counts")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
