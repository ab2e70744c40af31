"""`airflow standalone` with the repository's DAGs and plugin, for the demo and the
end-to-end tests, and a small client for Airflow's REST API.

``python -m tidemark_airflow.standalone start|stop|demo`` (``make demo``/``make stop``).
Standalone runs the api-server, scheduler, dag-processor and triggerer with the
LocalExecutor on SQLite and SimpleAuthManager. It is started in its own process
group, because its forked workers ignore a plain SIGTERM: stopping signals the
whole group, then kills what is left.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from spark_jobs.object_store import is_object_store
from spark_jobs.servers import free_port
from tidemark_airflow import SPARK_CONN_ID, rest

REPO = Path(__file__).resolve().parents[2]
# The CLI's default lakehouse from the repository (./lakehouse): `tidemark sql-server`,
# `tidemark tables` and the rest find the demo's tables without --lakehouse.
LAKEHOUSE = REPO / "lakehouse"
PID_FILE = "standalone.pid"
FINISHED = {"success", "failed"}
USER = "admin"
# The Spark connection the operators use, stored where the UI shows it; an
# AIRFLOW_CONN_TIDEMARK_SPARK in the environment still wins at run time.
SPARK_CONNECTION = {
    "connection_id": SPARK_CONN_ID,
    "conn_type": "spark",
    "host": "local[2]",
    "description": "Tidemark's spark-submit master: local[2] on this machine",
}
SIMPLE_AUTH_MANAGER = "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
PASSWORDS_FILE = "simple_auth_manager_passwords.json.generated"
RETRY_DELAY_SETTING = "AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY"


def environment(
    home: Path,
    lakehouse: Path | str,
    port: int,
    parallelism: int = 8,
    settings: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Standalone's settings: this repository's DAGs and plugin, no examples, a
    worker pool sized for a small machine (yet room for the four continuous
    streams beside a merge and an idleness check), the API on loopback (the Spark
    connection is stored by :func:`start`), tasks tried again 30 s after a failure
    unless the environment or ``settings`` say otherwise, ``settings`` (say
    ``TIDEMARK_PIPELINES``), and always a login: the simple auth manager with one
    admin whose password standalone generates, whatever the caller's environment
    or ``settings`` say (they could switch authentication off)."""
    venv_bin = str(Path(sys.executable).parent)
    return {
        # A failed stream's task is tried again after half a minute, unless told otherwise.
        RETRY_DELAY_SETTING: "30",
        **os.environ,
        **(settings or {}),
        "PATH": f"{venv_bin}:{os.environ.get('PATH', '')}",
        "AIRFLOW_HOME": str(home.resolve()),
        "LAKEHOUSE_DIR": str(lakehouse),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PARALLELISM": str(parallelism),
        "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": str(parallelism),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__CORE__AUTH_MANAGER": SIMPLE_AUTH_MANAGER,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        # Generated in this run's home, not a file from elsewhere with a known password.
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / PASSWORDS_FILE),
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "plugins"), os.environ.get("PYTHONPATH")])),
    }


@dataclass
class Airflow:
    """A running standalone and a REST client for it."""

    home: Path
    port: int
    process: subprocess.Popen | None = None
    _token: str | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def password(self) -> str:
        generated = self.home / PASSWORDS_FILE
        return json.loads(generated.read_text())[USER]

    def request(self, method: str, path: str, body: Any = None, token: str | None = "auto") -> Any:
        """JSON in and out; ``token="auto"`` logs in once, None sends no token."""
        return rest.call(self.url + path, method, body, self.token() if token == "auto" else token)

    def token(self) -> str:
        if self._token is None:
            credentials = {"username": USER, "password": self.password()}
            self._token = self.request("POST", "/auth/token", credentials, token=None)["access_token"]
        return self._token

    def wait_until_healthy(self, timeout: float = 300) -> None:
        def healthy() -> bool:
            try:
                health = self.request("GET", "/api/v2/monitor/health", token=None)
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return False
            return health["scheduler"]["status"] == "healthy"

        wait(healthy, timeout, "Airflow's api-server and scheduler")

    def wait_for_dags(self, dag_ids: list[str], timeout: float = 300) -> None:
        def parsed() -> bool:
            known = {dag["dag_id"] for dag in self.request("GET", "/api/v2/dags?limit=100")["dags"]}
            return set(dag_ids) <= known

        wait(parsed, timeout, f"the DAGs {dag_ids} to be parsed")

    def add_connection(self, connection: Mapping[str, Any]) -> None:
        """Store ``connection`` in Airflow's database, where Admin -> Connections lists it
        (a connection from an environment variable is not listed); one already stored stays."""
        try:
            self.request("POST", "/api/v2/connections", dict(connection))
        except urllib.error.HTTPError as error:
            if error.code != 409:  # 409: stored by an earlier start (the user may have edited it)
                raise

    def unpause(self, dag_id: str) -> None:
        self.request("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})

    def trigger(
        self, dag_id: str, conf: Mapping[str, Any] | None = None, logical_date: datetime | None = None
    ) -> str:
        return rest.trigger(self.url, dag_id, conf, self.token(), logical_date)

    def run_state(self, dag_id: str, run_id: str) -> str:
        return self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")["state"]

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 1200) -> str:
        wait(lambda: self.run_state(dag_id, run_id) in FINISHED, timeout, f"{dag_id} run {run_id}")
        return self.run_state(dag_id, run_id)


def wait(condition: Any, timeout: float, what: str, every: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def start(
    home: Path, lakehouse: Path | str, port: int | None = None, settings: Mapping[str, str] | None = None
) -> Airflow:
    home.mkdir(parents=True, exist_ok=True)
    if not is_object_store(str(lakehouse)):
        Path(lakehouse).mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    log = (home / "standalone.log").open("ab")
    process = subprocess.Popen(
        [str(Path(sys.executable).with_name("airflow")), "standalone"],
        env=environment(home, lakehouse, port, settings=settings),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    (home / PID_FILE).write_text(f"{process.pid} {port}\n")
    airflow = Airflow(home, port, process)
    try:
        airflow.wait_until_healthy()
        airflow.add_connection(SPARK_CONNECTION)
    except BaseException:  # a standalone that is not ready is not left running
        stop(home)
        raise
    return airflow


def stop(home: Path, grace: float = 20) -> bool:
    """Stop the standalone whose pid file is in ``home``: SIGTERM to its process
    group, then SIGKILL to whatever of the group is left, then SIGKILL to every
    process still carrying this ``AIRFLOW_HOME`` until none is left. Airflow runs each task in a
    process group of its own, so a task whose supervisor died before it could stop
    it (a spark-submit, say) is outside the standalone's group. False if none ran."""
    pid_file = home / PID_FILE
    if not pid_file.exists():
        return False
    group = int(pid_file.read_text().split()[0])
    for sig, pause in ((signal.SIGTERM, grace), (signal.SIGKILL, 10)):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + pause
        while time.monotonic() < deadline and _group_alive(group):
            time.sleep(0.5)
    # A JVM killed with SIGKILL takes a moment to go: kill, then wait until none is left.
    deadline = time.monotonic() + 90
    while (left := processes_of(home)) and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
    pid_file.unlink()
    return True


def processes_of(home: Path) -> list[int]:
    """Pids of live processes whose environment has ``AIRFLOW_HOME=home``."""
    marker = f"AIRFLOW_HOME={home.resolve()}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environment = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if marker in environment:
            found.append(int(entry.name))
    return found


def _group_alive(group: int) -> bool:
    """Whether a process of ``group`` still runs. ``killpg(group, 0)`` would also
    succeed on a group left with only a zombie (an exited leader that the caller,
    its parent, reaps only after this returns)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # After the command's closing parenthesis: state, parent, group, ...
            state, _, process_group = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
        except OSError:  # gone meanwhile
            continue
        if int(process_group) == group and state != "Z":
            return True
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tidemark_airflow.standalone")
    parser.add_argument("command", choices=("start", "stop"))
    parser.add_argument("--home", type=Path, default=REPO / ".tidemark" / "airflow")
    parser.add_argument("--lakehouse", type=Path, default=LAKEHOUSE)
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args(argv)
    if args.command == "stop":
        print("stopped Airflow" if stop(args.home) else "no Airflow was running")
        return 0
    airflow = start(args.home, args.lakehouse, args.port)
    print(f"Airflow is up at {airflow.url} (user {USER}, password {airflow.password()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
