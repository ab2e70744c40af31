"""A real ``airflow standalone`` for end-to-end tests, as a context manager.

It runs the repository's launcher (``tidemark_airflow.standalone``: its DAGs and
plugin, no examples, parallelism 8, SimpleAuthManager with one admin, a free
loopback port, ``LAKEHOUSE_DIR`` set) and, on exit, stops its process group.
Every process it started carries the run's unique ``AIRFLOW_HOME`` in its
environment, so anything that escaped the group is found and killed as well,
and reported in ``leftovers``::

    with airflow_standalone(tmp_path / "airflow", tmp_path / "lakehouse") as airflow:
        token = airflow.token()
        httpx.get(f"{airflow.url}/api/v2/dags", headers={"Authorization": f"Bearer {token}"})
    assert airflow.leftovers == []
"""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.error
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from tidemark_airflow.standalone import (
    PID_FILE,
    RETRY_DELAY_SETTING,
    USER,
    Airflow,
    processes_of,
    start,
    stop,
)

from spark_jobs.object_store import is_object_store

TESTS_RETRY_DELAY_S = 2
# A test's assertions are done by its teardown, and under load Airflow's components take
# up to the stop's whole 20 s grace to shut down (the e2e module's 13 s): a short one will do.
TEARDOWN_GRACE_S = 5


@dataclass
class Standalone:
    """A running standalone: where it listens, who may log in, and its REST client."""

    url: str
    username: str
    password: str
    home: Path
    client: Airflow
    leftovers: list[int] = field(default_factory=list)
    # Sessions of schedulers and triggerers killed or started by a test: LocalExecutor
    # workers rename themselves (setproctitle overwrites /proc/<pid>/environ), so
    # AIRFLOW_HOME cannot find the ones a killed scheduler orphaned.
    component_sessions: set[int] = field(default_factory=set)
    # (pid, start time) of the LocalExecutor workers a killed scheduler left behind:
    # idle in standalone's group, they ignore its SIGTERM, so its stop would wait
    # its whole grace for them.
    orphaned_workers: set[tuple[int, int | None]] = field(default_factory=set)

    def token(self) -> str:
        """A JWT from ``POST /auth/token`` for the admin user."""
        return self.client.token()


@contextmanager
def airflow_standalone(
    home: Path, lakehouse: Path | str, settings: Mapping[str, str] | None = None
) -> Iterator[Standalone]:
    """Start ``airflow standalone`` with state in ``home`` (and extra environment
    ``settings``) over ``lakehouse`` (a folder or an object store's URI) and wait
    until its api-server and scheduler are healthy; stop all of it on exit."""
    home = home.resolve()
    if not is_object_store(str(lakehouse)):
        lakehouse = Path(lakehouse).resolve()
    # A killed stream's retry starts in seconds: the tests wait for it, not for a delay.
    client = start(
        home, lakehouse, settings={RETRY_DELAY_SETTING: str(TESTS_RETRY_DELAY_S), **(settings or {})}
    )
    standalone = Standalone(client.url, USER, client.password(), home, client)
    try:
        yield standalone
    finally:
        for pid, started in standalone.orphaned_workers:
            if stat_field(pid, STARTTIME) == started:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        stop(home, grace=TEARDOWN_GRACE_S)
        for pid in members_of(standalone.component_sessions):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if client.process is not None:
            client.process.wait(timeout=30)  # reaped, not left a zombie
        standalone.leftovers = processes_of(home)
        for pid in standalone.leftovers:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def command_line(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0")
        return [part.decode(errors="replace") for part in raw.split(b"\0")]
    except OSError:  # gone meanwhile
        return []


STARTTIME = 19


def stat_field(pid: int, index: int) -> int | None:
    """A numeric field of /proc/<pid>/stat, counted after the command name (which
    may hold spaces): 1 is the parent, 3 the session, ``STARTTIME`` the start time."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[index])
    except (OSError, IndexError, ValueError):
        return None


def parent_of(pid: int) -> int | None:
    return stat_field(pid, 1)


def children_of(parent: int) -> list[int]:
    """Live processes whose parent is ``parent`` (found by /proc, not by AIRFLOW_HOME,
    which a renamed worker's environment no longer shows)."""
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and parent_of(int(entry.name)) == parent
    ]


def members_of(sessions: set[int]) -> list[int]:
    """Live processes in any of ``sessions``."""
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and stat_field(int(entry.name), 3) in sessions
    ]


def component_of(standalone: Standalone, component: str) -> int:
    """The pid of the ``airflow <component>`` (scheduler, triggerer) that standalone started."""
    parent = int((standalone.home / PID_FILE).read_text().split()[0])
    found = [
        pid
        for pid in processes_of(standalone.home)
        if parent_of(pid) == parent and command_line(pid)[-1:] == [component]
    ]
    assert len(found) == 1, f"expected one {component} under standalone {parent}, found {found}"
    return found[0]


def restart_component(standalone: Standalone, component: str) -> subprocess.Popen:
    """SIGKILL standalone's ``airflow <component>``, as a crash would (what it started,
    a scheduler's LocalExecutor workers and the tasks they run, a triggerer's trigger
    runner, is left orphaned), and start a new one with its environment, as a supervisor
    would. The new one cannot join standalone's process group (another session), but it
    carries the same AIRFLOW_HOME, by which stopping the standalone finds it."""
    pid = component_of(standalone, component)
    variables = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    environment = dict(item.decode().split("=", 1) for item in variables if b"=" in item)
    standalone.component_sessions.add(stat_field(pid, 3))
    standalone.orphaned_workers |= {(child, stat_field(child, STARTTIME)) for child in children_of(pid)}
    os.kill(pid, signal.SIGKILL)
    with (standalone.home / f"{component}-restarted.log").open("ab") as log:
        started = subprocess.Popen(
            [str(Path(environment["PATH"].split(":")[0]) / "airflow"), component],
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    standalone.component_sessions.add(started.pid)
    return started


def stream_drivers(job: str, pipeline: str) -> list[int]:
    """Python driver processes of a continuous ``job`` on ``pipeline``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        arguments = command_line(int(entry.name))
        is_driver = bool(arguments) and "python" in Path(arguments[0]).name
        runs_job = any(argument.endswith(f"jobs/{job}.py") for argument in arguments)
        if is_driver and runs_job and "continuous" in arguments and pipeline in arguments:
            found.append(int(entry.name))
    return found


def task_state(airflow: Airflow, dag_id: str, run_id: str, task_id: str) -> str | None:
    path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
    try:
        return airflow.request("GET", path)["state"]
    except urllib.error.HTTPError as error:
        if error.code == 404:  # a run not scheduled yet has no task instances
            return None
        raise


def trigger_logs(home: Path, dag_id: str, run_id: str, task_id: str) -> dict[int, str]:
    """A deferred task's trigger logs, by the id of the triggerer job that ran its trigger."""
    folder = home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
    logs = folder.glob("attempt=*.log.trigger.*.log")
    return {int(path.name.split(".")[-2]): path.read_text() for path in logs}


def newest_triggerer(airflow: Airflow) -> int:
    """The id of the triggerer job started last (a restarted triggerer's)."""
    triggerers = airflow.request("GET", "/api/v2/jobs?job_type=TriggererJob&limit=100")["jobs"]
    return max(job["id"] for job in triggerers)
