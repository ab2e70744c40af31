"""A throwaway PostgreSQL server on loopback, for tests that run Airflow on a real
database (the LocalExecutor on Postgres, as deployments do) instead of SQLite.

``PostgresServer(folder).start()`` makes a cluster with ``initdb``, starts ``postgres``
on 127.0.0.1 with a free port and its unix socket in the cluster's folder, and creates
a database and a password user for Airflow; ``airflow_settings()`` is what
``tidemark_airflow.standalone.start(settings=...)`` then needs. Airflow reaches it with
psycopg2 (its sync engine) and asyncpg (its async engine, derived from the sync URL):
both must be installed.

PostgreSQL refuses to run as root: as root, the cluster is made and run by the
``postgres`` OS user, so it lives where that user can reach it. pytest's ``tmp_path``
is under a ``0700`` folder of root's, so there the cluster goes to a folder of its own in
the system's temporary folder (removed by :meth:`PostgresServer.stop`); its log stays
in ``folder``. The binaries are ``$TIDEMARK_POSTGRES_BIN``'s, else those on ``PATH``,
else Debian's newest ``/usr/lib/postgresql/*/bin``.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL

from spark_jobs.servers import free_port, stop_group

BIN_VARIABLE = "TIDEMARK_POSTGRES_BIN"
OWNER = "postgres"  # the OS user that runs the cluster when we are root
SUPERUSER = "postgres"
# A unix socket's path is at most 107 bytes ("/.s.PGSQL.<port>" included).
SOCKET_PATH_MAX = 100
# A server for tests: durability is traded for speed (a crash loses the cluster, which
# a test throws away anyway). Airflow's components hold pools of up to 15 connections each.
SERVER_SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",
    # As production should have it (docs/guides/deployment.md): a scheduler killed inside a
    # transaction leaves it open while its forked LocalExecutor workers hold the socket,
    # and its row locks kept the next scheduler from queueing any task.
    "idle_in_transaction_session_timeout": "30s",
}


def postgres_bin() -> Path:
    """The folder of ``initdb``, ``postgres``, ``psql`` and ``pg_isready``."""
    if configured := os.environ.get(BIN_VARIABLE):
        return Path(configured)
    on_path = shutil.which("initdb")
    if on_path:
        # Resolved: a PATH folder may hold links to only some of them (initdb, not pg_isready).
        return Path(on_path).resolve().parent
    # Debian keeps the server's binaries off PATH (only wrappers of the clients are on it).
    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda path: int(path.parts[-3]))
    if debian:
        return debian[-1].parent
    raise RuntimeError(f"no PostgreSQL server binaries (initdb): install postgresql or set ${BIN_VARIABLE}")


def _as_owner() -> dict[str, Any]:
    """``Popen`` arguments that run a command as the cluster's owner: ``postgres`` when
    we are root (set directly, not through ``runuser``: it stays as the server's parent,
    so a signal meant for the postmaster would reach runuser instead), else ourselves."""
    if os.geteuid() != 0:
        return {}
    return {"user": OWNER, "group": pwd.getpwnam(OWNER).pw_gid, "extra_groups": []}


class PostgresServer:
    """One PostgreSQL cluster on 127.0.0.1, with ``database`` owned by ``user`` (who logs
    in with ``password`` over TCP; the superuser only over the unix socket)."""

    def __init__(
        self,
        folder: str | Path,
        database: str = "airflow",
        user: str = "airflow",
        password: str | None = None,
        port: int | None = None,
    ) -> None:
        self.folder = Path(folder).resolve()
        self.database, self.user = database, user
        self.password = password or secrets.token_hex(16)
        self.port = port or free_port()
        self.bin = postgres_bin()
        self.cluster: Path | None = None  # data/ and socket/, reachable by the owner
        self._scratch = False  # whether the cluster is in a folder of its own, removed on stop
        self.process: subprocess.Popen | None = None

    @property
    def sqlalchemy_url(self) -> str:
        url = URL.create(
            "postgresql+psycopg2", self.user, self.password, "127.0.0.1", self.port, self.database
        )
        return url.render_as_string(hide_password=False)

    def airflow_settings(self) -> dict[str, str]:
        """Airflow's metadata in this database, tasks on the LocalExecutor."""
        return {
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.sqlalchemy_url,
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        }

    @property
    def socket_dir(self) -> Path:
        assert self.cluster is not None, "not started"
        return self.cluster / "socket"

    def _reachable_by_owner(self, folder: Path) -> bool:
        if os.geteuid() != 0:
            return True
        return subprocess.run(["test", "-x", str(folder)], **_as_owner()).returncode == 0

    def _make_cluster_folder(self) -> Path:
        """``folder/postgres`` when the owner can reach it and its socket path fits,
        else a new folder in the system's temporary folder."""
        inside = self.folder / "postgres"
        socket = inside / "socket" / f".s.PGSQL.{self.port}"
        if len(str(socket)) <= SOCKET_PATH_MAX and self._reachable_by_owner(self.folder):
            inside.mkdir(exist_ok=True)
            cluster = inside
        else:
            cluster, self._scratch = Path(tempfile.mkdtemp(prefix="tidemark-postgres-")), True
        (cluster / "socket").mkdir(exist_ok=True)
        if os.geteuid() == 0:
            for path in (cluster, cluster / "socket"):
                shutil.chown(path, OWNER, pwd.getpwnam(OWNER).pw_gid)
        return cluster

    def _run(self, *command: str, as_owner: bool = False) -> str:
        done = subprocess.run(
            [str(self.bin / command[0]), *command[1:]],
            capture_output=True,
            text=True,
            cwd=self.cluster,
            stdin=subprocess.DEVNULL,
            **(_as_owner() if as_owner else {}),
        )
        if done.returncode:
            raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stdout}{done.stderr}")
        return done.stdout

    def start(self, timeout_s: float = 60.0) -> PostgresServer:
        """Make the cluster (once), start the server, wait until it accepts connections
        on 127.0.0.1, then make sure of the user, its password and its database."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.cluster is None:
            self.cluster = self._make_cluster_folder()
        data = self.cluster / "data"
        if not (data / "PG_VERSION").exists():
            self._run(
                "initdb",
                f"--pgdata={data}",
                f"--username={SUPERUSER}",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
                as_owner=True,
            )
        settings = {
            **SERVER_SETTINGS,
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.socket_dir),
        }
        with open(self.folder / "postgres.log", "ab") as log:  # the server keeps its own copy
            self.process = subprocess.Popen(
                [
                    str(self.bin / "postgres"),
                    "-D",
                    str(data),
                    *(f"-c{key}={value}" for key, value in settings.items()),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.cluster,
                start_new_session=True,
                **_as_owner(),
            )
        try:
            self._wait_until_ready(timeout_s)
        except BaseException:  # a server that is not ready is not left running
            self.stop()
            raise
        self._create_user_and_database()
        return self

    def _create_user_and_database(self) -> None:
        """Idempotent, so a folder's cluster can be started again by a new instance
        (whose password is new)."""
        role = (
            "CREATE" if not self.query(f"SELECT 1 FROM pg_roles WHERE rolname = '{self.user}'") else "ALTER"
        )
        self.query(f"{role} ROLE {self.user} LOGIN PASSWORD '{self.password}'")
        if not self.query(f"SELECT 1 FROM pg_database WHERE datname = '{self.database}'"):
            self.query(f"CREATE DATABASE {self.database} OWNER {self.user}")

    def _wait_until_ready(self, timeout_s: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while not self._ready():
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"postgres exited with {self.process.returncode}; see {self.folder}/postgres.log"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"PostgreSQL not ready on 127.0.0.1:{self.port} after {timeout_s}s")
            time.sleep(0.1)

    def _ready(self) -> bool:
        probe = [str(self.bin / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port), "-t", "1"]
        return subprocess.run(probe, stdin=subprocess.DEVNULL).returncode == 0

    def query(self, sql: str, database: str = "postgres") -> str:
        """``sql``'s rows as psql prints them unaligned (``|`` between columns), run
        by the superuser over the unix socket."""
        return self._run(
            "psql",
            "--no-psqlrc",
            "--no-align",
            "--tuples-only",
            "--set=ON_ERROR_STOP=1",
            f"--host={self.socket_dir}",
            f"--port={self.port}",
            f"--username={SUPERUSER}",
            f"--dbname={database}",
            f"--command={sql}",
        ).strip()

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Fast shutdown (clients' transactions rolled back, their connections closed),
        then the process group's SIGTERM and SIGKILL if it hangs; a cluster in a folder
        of its own is removed."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                stop_group(self.process, grace_s=5)
        if self._scratch and self.cluster is not None:
            shutil.rmtree(self.cluster, ignore_errors=True)
            self.cluster, self._scratch = None, False
