"""The operators every Tidemark DAG uses: each job is one ``spark-submit`` through
the Airflow Spark connection (``tidemark_spark``: ``local[2]`` by default, a
cluster URL in production), so where a job runs is the connection's business.

The connection's master is read when the task runs, not when the DAG is parsed:
it picks the session factory's profile (small-machine settings for a local
master) and, on a cluster, ships ``spark_jobs`` to the executors as a zip in
``--py-files``. The driver runs where the task runs (client mode: PySpark cannot
use cluster deploy mode on a standalone master)."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Asset, BaseHook, Param
from airflow.sdk.exceptions import AirflowException

from spark_jobs.config import configured_pipeline_files, load_pipeline, pipeline_path
from spark_jobs.session import JVM_PROFILE_VARIABLE, JVM_PROFILES, is_local_master, spark_conf
from spark_jobs.submit import job_profile, job_script, package_zip
from spark_jobs.tables import join, lakehouse_root
from tidemark_airflow import SPARK_CONN_ID
from tidemark_airflow.health import stalled_query

# A batch task (an available-now pass, a merge, a check, a backfill) that runs this long is
# stuck, not slow: Airflow fails it, and its retries (if any) start it again.
BATCH_TIMEOUT = timedelta(hours=3)
# Between tries a task waits the deployment's [core] default_task_retry_delay: one setting
# per Airflow (the launcher sets 30 s, Airflow's own default is 300 s; tests take seconds).
DEFAULT_ARGS = {"owner": "tidemark", "retries": 2}
DEFAULT_PIPELINE = "telemetry"


def pipeline_files() -> dict[str, str]:
    """Pipeline name -> YAML file, from ``$TIDEMARK_PIPELINES`` (files or folders,
    colon-separated), by default the pipelines shipped with the repository."""
    return configured_pipeline_files()


def pipeline_file(name: str) -> str:
    """The YAML file of the configured pipeline ``name`` (:func:`pipeline_path`'s rule)."""
    return str(pipeline_path(name))


def default_pipeline() -> str:
    """The pipeline a run without one in its conf runs: ``telemetry`` if configured,
    else the first configured name."""
    names = sorted(pipeline_files())
    return DEFAULT_PIPELINE if DEFAULT_PIPELINE in names or not names else names[0]


def pipeline_param() -> Param:
    """The pipeline to run, chosen from the configured pipeline files."""
    names = sorted(pipeline_files())
    return Param(
        default_pipeline(),
        type="string",
        enum=names,
        description="pipeline (a YAML file under TIDEMARK_PIPELINES)",
    )


def jvm_profile_param() -> Param:
    """A run's choice of its jobs' JVM profile (none: the workers' default)."""
    return Param(
        None,
        type=["null", "string"],
        enum=[None, *JVM_PROFILES],
        values_display={"null": "the workers' default"},
        description="the jobs' JVM profile: throughput for large batches, short-jobs for small ones "
        "(the workers' default: $TIDEMARK_JVM_PROFILE, else short-jobs for continuous streams and "
        "throughput for the rest)",
    )


def checkpoint_of(pipeline: str, job: str | None = None) -> str:
    """Where a streaming job keeps its checkpoint by default (jobs/common.py); with
    no job, the folder of the pipeline's checkpoints (``tidemark run``'s queries)."""
    config = load_pipeline(pipeline_file(pipeline))
    return join(lakehouse_root(), "_checkpoints", config.name, *([job] if job else []))


def spark_master(conn_type: str, host: str | None, port: int | None) -> str:
    """The master a Spark connection stands for, read as the Spark provider reads it:
    a ``spark`` connection made in the UI holds the master in its host (``local[2]``,
    ``spark://h``), one made from a URI (``spark://h:7077``) holds the scheme in its
    type; the port, when set, follows."""
    if conn_type == "spark" and host and ("://" in host or not port):
        master = host
    else:
        master = f"{conn_type}://{host or ''}"
    return f"{master}:{port}" if port else master


class TidemarkJobOperator(SparkSubmitOperator):
    """``spark-submit spark_jobs/jobs/<job>.py <job_args>``, with the session
    factory's settings (Delta, the local jars, UTC) for the connection's master
    and this interpreter for the Python driver and workers; on a cluster the
    executors' workers run ``$TIDEMARK_EXECUTOR_PYTHON`` when set (their image's
    Python). ``conf`` overrides the factory's settings, ``env`` the environment.
    ``jvm_profile`` (templated; empty: the worker's ``$TIDEMARK_JVM_PROFILE``, else
    short-jobs for a continuous stream and throughput for the rest) picks the job's
    JVM profile, :data:`~spark_jobs.session.JVM_PROFILES`."""

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "jvm_profile")

    def __init__(
        self,
        *,
        job: str,
        job_args: Sequence[str] | Any,
        env: Mapping[str, str] | None = None,
        conf: Mapping[str, Any] | None = None,
        jvm_profile: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.job, self.jvm_profile = job, jvm_profile
        interpreter = {
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            # The connection names the binary (`spark-submit`); pyspark installs it beside
            # this interpreter, which need not be on the worker's PATH.
            "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
        }
        kwargs.setdefault("conn_id", SPARK_CONN_ID)
        if "execution_timeout" not in (kwargs.get("default_args") or {}):  # a DAG's own wins
            kwargs.setdefault("execution_timeout", BATCH_TIMEOUT)
        self.spark_conn_id = kwargs["conn_id"]
        self._env_overrides = dict(env or {})
        super().__init__(
            application=job_script(job),
            conf=dict(conf or {}),
            application_args=job_args,
            name=f"tidemark-{job}",
            env_vars={**interpreter, **(env or {})},
            **kwargs,
        )

    def execute(self, context: Any) -> None:
        self.settle_submit()
        super().execute(context)

    def settle_submit(self) -> None:
        """Before the submit: the connection's master chooses the settings and, on a
        cluster, the package zip joins ``py_files``. Idempotent (a retry settles again)."""
        connection = BaseHook.get_connection(self.spark_conn_id)
        local = is_local_master(spark_master(connection.conn_type, connection.host, connection.port))
        chosen = self.jvm_profile or None
        default = job_profile(self.job, self.application_args or [], local)
        self.conf = spark_conf(local, self.conf, default, chosen)
        if chosen is not None:  # the driver's session repeats the profile's settings
            self.env_vars = {**(self.env_vars or {}), JVM_PROFILE_VARIABLE: chosen}
        if not local:
            shipped = [path for path in (self.py_files or "").split(",") if path]
            package = package_zip()
            self.py_files = ",".join([package, *(path for path in shipped if path != package)])
            executor_python = os.environ.get("TIDEMARK_EXECUTOR_PYTHON")
            if executor_python and "PYSPARK_PYTHON" not in self._env_overrides:
                self.env_vars = {**(self.env_vars or {}), "PYSPARK_PYTHON": executor_python}


class SupervisedStreamOperator(TidemarkJobOperator):
    """A long-running stream with a watchdog. A stream that is alive but stuck
    (a micro-batch started and not committed within ``stall_after``) is killed,
    so the task fails and its retries restart the stream from its checkpoint.
    ``checkpoint`` is the stream's, or the folder of an application's queries'."""

    template_fields: Sequence[str] = (*TidemarkJobOperator.template_fields, "checkpoint")

    def __init__(
        self, *, checkpoint: str, stall_after: timedelta, poll_interval: float = 10.0, **kwargs: Any
    ) -> None:
        # A stream runs until stopped: its watchdog, not a deadline, ends a stuck one.
        kwargs.setdefault("execution_timeout", None)
        super().__init__(**kwargs)
        self.checkpoint = checkpoint
        self.stall_after = stall_after
        self.poll_interval = poll_interval

    def execute(self, context: Any) -> None:
        done = threading.Event()
        stalled: list[str] = []
        # A restarted stream re-runs the batch it was killed in: it gets the whole limit
        # from now (and the submit is long under way before anything can be killed).
        watched_since = time.time()

        def watch() -> None:
            while not done.wait(self.poll_interval):
                reason = stalled_query(self.checkpoint, self.stall_after, watched_since=watched_since)
                if reason is not None:
                    stalled.append(reason)
                    self.log.error("stream stalled: %s; killing it so the task retries", reason)
                    self.on_kill()
                    return

        watchdog = threading.Thread(target=watch, name="tidemark-stream-watchdog", daemon=True)
        watchdog.start()
        try:
            super().execute(context)
        except AirflowException as error:
            if stalled:
                raise AirflowException(f"stream stalled: {stalled[0]}") from error
            raise
        finally:
            done.set()


# Jinja helpers every DAG declares (user_defined_macros), so task arguments can
# follow the run's Params.
MACROS = {"pipeline_file": pipeline_file, "checkpoint_of": checkpoint_of}
PIPELINE_ARGS = ("--pipeline", "{{ pipeline_file(params.pipeline) }}")
GOLD_ASSET = Asset("tidemark_gold", uri="file:///tidemark/gold")
STATUS_ASSET = Asset("tidemark_status_events", uri="file:///tidemark/status_events")
# Silver's passes emit it: the late merge runs on it (and on a clock, for continuous streams).
QUARANTINE_ASSET = Asset("tidemark_quarantine", uri="file:///tidemark/quarantine")


def dag_settings(*tags: str, **overrides: Any) -> dict[str, Any]:
    """What every Tidemark DAG declares: no catch-up (streams continue from their
    checkpoints, not from missed intervals), one run at a time, the owner and
    retries, the Jinja helpers, and its tags."""
    settings = {
        "start_date": datetime(2026, 1, 1),
        "catchup": False,
        "max_active_runs": 1,
        "default_args": DEFAULT_ARGS,
        "user_defined_macros": MACROS,
        "tags": ["tidemark", *tags],
    }
    return {**settings, **overrides}
