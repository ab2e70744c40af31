"""spark-submit commands for the jobs, with the session factory's settings.

The CLI, the tests and Airflow's ``TidemarkJobOperator`` all start jobs this way,
so a job behaves the same wherever it is launched.

On a cluster master the job's Python code must reach the executors' Python
workers, which need not share the driver's disk: :func:`package_zip` builds
``spark_jobs`` into one deterministic zip that spark-submit ships with
``--py-files`` (the driver then imports the same zip, so driver and executors run
identical code). The jars travel in ``spark.jars``, served by the driver.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import pyspark

from spark_jobs.arguments import stream_trigger
from spark_jobs.session import is_local_master, profile_for_trigger, spark_conf

PACKAGE_DIR = Path(__file__).resolve().parent
JOBS_DIR = PACKAGE_DIR / "jobs"
# What the package consists of (pyproject's package data included).
PACKAGE_SUFFIXES = (".py", ".yaml", ".properties")
ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def spark_submit_binary() -> str:
    return str(Path(pyspark.__file__).parent / "bin" / "spark-submit")


def job_script(job: str) -> str:
    script = JOBS_DIR / f"{job}.py"
    if not script.exists():
        raise ValueError(f"no such job: {job}")
    return str(script)


def cache_dir() -> Path:
    """``$TIDEMARK_CACHE_DIR``, else ``$XDG_CACHE_HOME/tidemark``, else ``~/.cache/tidemark``."""
    configured = os.environ.get("TIDEMARK_CACHE_DIR")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tidemark"


def package_bytes() -> bytes:
    """``spark_jobs`` as zip bytes that depend only on the files' paths and contents:
    entries sorted, fixed timestamps and permissions, no bytecode."""
    files = sorted(
        path
        for path in PACKAGE_DIR.rglob("*")
        if path.is_file() and path.suffix in PACKAGE_SUFFIXES and "__pycache__" not in path.parts
    )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path in files:
            entry = zipfile.ZipInfo(path.relative_to(PACKAGE_DIR.parent).as_posix(), ZIP_TIME)
            entry.compress_type = zipfile.ZIP_DEFLATED
            entry.external_attr = 0o644 << 16
            archive.writestr(entry, path.read_bytes())
    return buffer.getvalue()


def package_zip(folder: str | Path | None = None) -> str:
    """The zip of ``spark_jobs`` for ``--py-files``, named by its content hash in
    ``folder`` (default :func:`cache_dir`): written once per version of the code,
    atomically, so concurrent submits share it."""
    data = package_bytes()
    target = Path(folder or cache_dir())
    path = target / f"spark_jobs-{hashlib.sha256(data).hexdigest()[:16]}.zip"
    if not path.exists():
        target.mkdir(parents=True, exist_ok=True)
        partial = target / f".{path.name}.{os.getpid()}.tmp"
        partial.write_bytes(data)
        os.replace(partial, path)
    return str(path)


def job_profile(job: str, job_args: Sequence[str], local: bool) -> str:
    """The JVM profile ``job`` starts under on a ``local`` master or a cluster unless
    one is chosen (a run's or ``$TIDEMARK_JVM_PROFILE``): :func:`profile_for_trigger`."""
    return profile_for_trigger(stream_trigger(job, job_args), local)


def submit_command(
    job: str,
    job_args: list[str],
    master: str | None = None,
    local_threads: int = 2,
    conf: Mapping[str, str] | None = None,
) -> list[str]:
    """``conf`` overrides the session factory's settings for this job. On a cluster
    master the package is shipped to the executors with ``--py-files``."""
    master = master or os.environ.get("TIDEMARK_SPARK_MASTER") or f"local[{local_threads}]"
    local = is_local_master(master)
    command = [spark_submit_binary(), "--master", master, "--name", f"tidemark-{job}"]
    if not local:
        command += ["--py-files", package_zip()]
    for key, value in spark_conf(local, conf, job_profile(job, job_args, local)).items():
        command += ["--conf", f"{key}={value}"]
    return [*command, job_script(job), *job_args]


def submit_env() -> dict[str, str]:
    """The environment a job needs: this interpreter for the driver and the workers."""
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
