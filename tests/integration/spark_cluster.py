"""A Spark standalone cluster on loopback, as docker-compose.yml runs one: a master and
workers started from the pyspark distribution, each worker with a work folder of its
own, every daemon in its own process group and always stopped::

    with standalone_cluster(tmp_path / "cluster", workers=2) as cluster:
        ...  # spark-submit --master cluster.master_url
        cluster.applications()  # finished applications by name
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from spark_jobs.servers import free_port

SPARK_HOME = Path(pyspark.__file__).parent
START_TIMEOUT_S = 120


@dataclass
class Cluster:
    master_url: str
    master_ui: str
    worker_uis: list[str] = field(default_factory=list)
    work_dirs: list[Path] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def master_state(self) -> dict:
        return fetch_json(f"{self.master_ui}/json/")

    def worker_states(self) -> list[dict]:
        return [fetch_json(f"{ui}/json/") for ui in self.worker_uis]

    def applications(self) -> dict[str, dict]:
        """Finished applications on the master by name (``tidemark-<job>-<pipeline>``)."""
        return {app["name"]: app for app in self.master_state()["completedapps"]}

    def executors_by_app(self) -> dict[str, list[dict]]:
        """Every executor any worker ran or runs, by application id (``workdir`` says which worker)."""
        found: dict[str, list[dict]] = {}
        for worker in self.worker_states():
            for executor in worker["executors"] + worker["finishedexecutors"]:
                found.setdefault(executor["appid"], []).append(executor)
        return found

    def log_tails(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in self.logs if log.exists())


def fetch_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def spark_class(
    folder: Path, name: str, *args: str, settings: Mapping[str, str] | None = None
) -> tuple[subprocess.Popen, Path]:
    """A Spark daemon in the foreground, in its own process group, logging to a file."""
    log = folder / f"{name}.log"
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_NO_DAEMONIZE": "1",
        "SPARK_LOG_DIR": str(folder / "logs"),
        **(settings or {}),
    }
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    return process, log


def stop(process: subprocess.Popen) -> None:
    for sig, patience in ((signal.SIGTERM, 30), (signal.SIGKILL, 30)):
        if process.poll() is not None:
            return
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=patience)
        except subprocess.TimeoutExpired:
            continue


def wait_until(condition, timeout: float, what: str, cluster_logs=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{cluster_logs()}")


@contextmanager
def standalone_cluster(
    folder: Path,
    workers: int = 1,
    cores: int = 2,
    memory: str = "1g",
    default_cores: int | None = None,
    worker_environment: Mapping[str, str] | None = None,
) -> Iterator[Cluster]:
    """A master and ``workers`` workers (``cores`` and ``memory`` each) on free loopback
    ports. ``default_cores`` caps what an application gets unless it asks
    (``spark.deploy.defaultCores``), so that applications share the workers; the
    workers' executors inherit ``worker_environment`` (say, object store credentials)."""
    folder.mkdir(parents=True, exist_ok=True)
    port, master_ui = free_port(), free_port()
    # As docker-compose.yml sets it.
    master_options = (
        {"SPARK_MASTER_OPTS": f"-Dspark.deploy.defaultCores={default_cores}"} if default_cores else {}
    )
    cluster = Cluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{master_ui}")
    with ExitStack() as daemons:

        def start(name: str, *args: str, settings: Mapping[str, str] | None = None) -> None:
            process, log = spark_class(folder, name, *args, settings=settings)
            daemons.callback(stop, process)
            cluster.logs.append(log)

        start(
            "master",
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(master_ui)),
            settings=master_options,
        )
        wait_until(
            lambda: cluster.master_state()["status"] == "ALIVE",
            START_TIMEOUT_S,
            "the master",
            cluster.log_tails,
        )
        for number in range(1, workers + 1):
            work_dir, worker_ui = folder / f"worker-{number}", free_port()
            work_dir.mkdir()
            start(
                f"worker-{number}",
                "org.apache.spark.deploy.worker.Worker",
                cluster.master_url,
                *("--host", "127.0.0.1", "--port", str(free_port()), "--webui-port", str(worker_ui)),
                *("--cores", str(cores), "--memory", memory, "--work-dir", str(work_dir)),
                settings=dict(worker_environment or {}),
            )
            cluster.worker_uis.append(f"http://127.0.0.1:{worker_ui}")
            cluster.work_dirs.append(work_dir)
        wait_until(
            lambda: cluster.master_state()["aliveworkers"] == workers,
            START_TIMEOUT_S,
            "the workers",
            cluster.log_tails,
        )
        yield cluster
