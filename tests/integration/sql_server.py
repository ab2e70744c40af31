"""``tidemark sql-server`` really started over a lakehouse with no pipeline files
(it finds every table under the layer folders), and ``tidemark sql`` (beeline)
against it; the README's SQL cookbook."""

from __future__ import annotations

import csv
import io
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from spark_jobs.servers import free_port
from spark_jobs.submit import submit_env
from spark_jobs.tables import TableRef
from tests.integration.conftest import kill_hard, wait_for

TIDEMARK = str(Path(sys.executable).with_name("tidemark"))
README = Path(__file__).resolve().parents[2] / "README.md"


def server_command(port: int, lakehouse: str, *pipelines: Path) -> list[str]:
    command = [TIDEMARK, "sql-server", "--port", str(port), "--lakehouse", lakehouse, "--refresh", "2s"]
    return command + [argument for path in pipelines for argument in ("--pipeline", str(path))]


@dataclass
class SqlServer:
    port: int
    process: subprocess.Popen
    log: list[str]

    def sql(self, query: str, output: str = "csv", timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [TIDEMARK, "sql", "--port", str(self.port), "--format", output, query],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def rows(self, query: str) -> list[dict]:
        done = self.sql(query)
        assert done.returncode == 0, done.stderr
        return list(csv.DictReader(io.StringIO(done.stdout)))

    def value(self, query: str) -> int:
        (row,) = self.rows(query)
        return int(next(iter(row.values())))

    def counts(self, tables: Iterable[TableRef]) -> dict[str, int]:
        """Each table's row count by its SQL name, in one query (a client call is a JVM of its own)."""
        union = " UNION ALL ".join(
            f"SELECT '{table.sql_name}' AS name, count(*) AS n FROM {table.sql_name}" for table in tables
        )
        return {row["name"]: int(row["n"]) for row in self.rows(union)}


@contextmanager
def sql_server(lakehouse: str, no_pipelines: Path, *options: str) -> Iterator[SqlServer]:
    """The server over ``lakehouse`` (and its further command-line ``options``), with
    ``$TIDEMARK_PIPELINES`` an empty folder ``no_pipelines``, from listening until it
    is stopped."""
    no_pipelines.mkdir(exist_ok=True)
    port = free_port()
    process = subprocess.Popen(
        [*server_command(port, lakehouse), *options],
        env={**submit_env(), "TIDEMARK_PIPELINES": str(no_pipelines)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    log: list[str] = []
    threading.Thread(target=lambda: log.extend(process.stdout), daemon=True).start()
    try:
        wait_for(
            lambda: any("listening on" in line for line in log) or process.poll() is not None, 240, "server"
        )
        assert process.poll() is None, "".join(log[-50:])
        yield SqlServer(port, process, log)
    finally:
        with suppress(ProcessLookupError):  # it may have ended by itself (the failure above says why)
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            kill_hard(process)


def cookbook_statements() -> list[str]:
    """The SQL statements of the README's cookbook, comments dropped."""
    section = README.read_text().split("## SQL: every table over the wire", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sql\n", 1)[1].split("```", 1)[0]
    code = "\n".join(line for line in block.splitlines() if not line.lstrip().startswith("--"))
    return [statement.strip() for statement in code.split(";") if statement.strip()]
