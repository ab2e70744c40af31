"""``tidemark sql``: queries the SQL server through beeline, the HiveServer2
client bundled with pyspark, and prints the result or the server's error in a
few lines (no Java stack trace)."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pyspark

from spark_jobs.session import JVM_PROFILES, SERIAL_COLLECTOR

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 10000
FORMATS = {"table": "table", "csv": "csv2", "tsv": "tsv2"}
# Java exception class names and the wrappers HiveServer2 adds around Spark's message.
JAVA_NOISE = re.compile(
    r"(Error: |Error running query: |\b(?:[a-z0-9_]+\.)+[A-Za-z0-9_$]+(?:Exception|Error): )"
)
ERROR_CLASS_ONLY = re.compile(r"^\[[A-Z0-9_.]+\]$")
REPEATED_ERROR_CLASS = re.compile(r"^(\[[A-Z0-9_.]+\]) \1 ")
PROMPT = re.compile(r"^\d+: jdbc:hive2://\S*> ?")
# beeline is a JVM that lives for one query, a job of seconds: C1 alone and the serial
# collector, whose threads cost such a job less than the JDK's defaults.
BEELINE_OPTIONS_VARIABLE = "SPARK_BEELINE_OPTS"
BEELINE_JAVA_OPTIONS = f"{JVM_PROFILES['short-jobs'].java_options} {SERIAL_COLLECTOR}"
UNREACHABLE = ("Could not open client transport", "Connection refused")


def beeline_command(host: str, port: int, output: str = "table", query: str | None = None) -> list[str]:
    beeline = str(Path(pyspark.__file__).parent / "bin" / "beeline")
    command = [beeline, "-u", f"jdbc:hive2://{host}:{port}/default", f"--outputformat={FORMATS[output]}"]
    return [*command, "--silent=true", "-e", query] if query is not None else command


def beeline_environment(environment: Mapping[str, str]) -> dict[str, str]:
    """``environment`` with beeline's JVM options; the caller's own
    ``$SPARK_BEELINE_OPTS`` come after them, and the JVM takes the last of each."""
    own = environment.get(BEELINE_OPTIONS_VARIABLE, "")
    return {**environment, BEELINE_OPTIONS_VARIABLE: f"{BEELINE_JAVA_OPTIONS} {own}".rstrip()}


def condensed_error(stderr: str, host: str, port: int) -> str:
    """The server's message up to its SQLSTATE, without beeline's noise or the stack trace."""
    if any(marker in stderr for marker in UNREACHABLE):
        return f"cannot reach the SQL server at {host}:{port} (start it with `tidemark sql-server`)"
    lines = stderr.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Error: ")), None)
    if start is None:
        return stderr.strip() or "beeline failed without a message"
    message = []
    for line in lines[start:]:
        if line.startswith(("\tat ", "Caused by")):
            break
        message.append(line)
        if "SQLSTATE" in line:
            break
    cleaned = (REPEATED_ERROR_CLASS.sub(r"\1 ", JAVA_NOISE.sub("", line).strip()) for line in message)
    return "\n".join(line for line in cleaned if line and not ERROR_CLASS_ONLY.match(line))


def run_query(host: str, port: int, query: str, output: str = "table") -> tuple[int, str, str]:
    """(exit code, result, error) of one or more ``;``-separated statements."""
    done = subprocess.run(
        beeline_command(host, port, output, query),
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=beeline_environment(os.environ),
    )
    # Silent beeline still prints its prompt before a result or a failure.
    result = "\n".join(PROMPT.sub("", line) for line in done.stdout.splitlines()).strip("\n")
    if done.returncode != 0:
        return done.returncode, result, condensed_error(done.stderr, host, port)
    return 0, result, ""


def interactive(host: str, port: int, output: str) -> None:
    """Replace this process with an interactive beeline session."""
    command = beeline_command(host, port, output)
    os.execve(command[0], command, beeline_environment(os.environ))
