"""Start and supervise one pipeline's streams: bronze, silver, gold, offline detection.

- **available-now** (the schedule's mode): each job drains its backlog and exits,
  in dependency order; the next scheduled run continues from the checkpoints. A
  scheduled run that finds another run queued behind it skips its pass.
- **continuous** (trigger by hand): the four streams run side by side until
  stopped; a failed stream exits 1 and its task's retries restart it, and a stream
  that is alive but stalled is killed by its watchdog, so the same retries apply.

By default the four streams are queries of one Spark application (`tidemark run`,
one task: one JVM start-up instead of four, and a failed query fails the task).
Turn `one_application` off to submit each stream on its own (scale-out on a
cluster); both keep each stream's checkpoint, so a pipeline can move between them.
`jvm_profile` picks the streams' JVM profile for this run, ahead of the workers'
`TIDEMARK_JVM_PROFILE`; without either, continuous streams start under `short-jobs`
(their batches are one interval's records) and available-now passes under `throughput`.
"""

from datetime import timedelta

from airflow.sdk import Param, TaskGroup, dag, task
from airflow.sdk.types import DagRunProtocol, RuntimeTaskInstanceProtocol
from tidemark_airflow.health import STALL_AFTER
from tidemark_airflow.operators import (
    GOLD_ASSET,
    PIPELINE_ARGS,
    QUARANTINE_ASSET,
    STATUS_ASSET,
    SupervisedStreamOperator,
    TidemarkJobOperator,
    dag_settings,
    jvm_profile_param,
    pipeline_param,
)

STREAMS = ("bronze", "silver", "gold", "offline")
JVM_PROFILE = "{{ params.jvm_profile or '' }}"


@dag(
    dag_id="tidemark_streaming",
    schedule=timedelta(minutes=10),
    doc_md=__doc__,
    params={
        "pipeline": pipeline_param(),
        "mode": Param(
            "available-now", enum=["available-now", "continuous"], description="how the streams run"
        ),
        "interval": Param("10s", type="string", description="continuous mode: micro-batch interval"),
        "one_application": Param(
            True,
            type="boolean",
            description="the four streams as queries of one Spark application (off: a submit each)",
        ),
        "jvm_profile": jvm_profile_param(),
    },
    **dag_settings("streaming"),
)
def tidemark_streaming() -> None:
    @task.branch
    def choose_mode(
        params: dict | None = None,
        dag_run: DagRunProtocol | None = None,
        ti: RuntimeTaskInstanceProtocol | None = None,
    ) -> list[str] | None:
        # A scheduled pass only drains from the checkpoints, and one run goes at a time:
        # any run queued behind it (most often one someone triggered) does that as well,
        # so the pass gives way rather than hold it up (unpausing starts a scheduled run).
        if dag_run.run_type == "scheduled" and ti.get_dr_count(dag_id=dag_run.dag_id, states=["queued"]):
            return None
        group = "continuous" if params["mode"] == "continuous" else "available_now"
        if params["one_application"]:
            return [f"{group}.pipeline"]
        return [f"continuous.{job}" for job in STREAMS] if group == "continuous" else ["available_now.bronze"]

    with TaskGroup("available_now") as available_now:
        drained = {
            job: TidemarkJobOperator(
                task_id=job,
                job=job,
                job_args=[*PIPELINE_ARGS, "--trigger", "available-now"],
                jvm_profile=JVM_PROFILE,
                outlets={"silver": [QUARANTINE_ASSET], "gold": [GOLD_ASSET], "offline": [STATUS_ASSET]}.get(
                    job, []
                ),
            )
            for job in STREAMS
        }
        drained["bronze"] >> drained["silver"] >> [drained["gold"], drained["offline"]]
        TidemarkJobOperator(
            task_id="pipeline",
            job="run",
            job_args=[*PIPELINE_ARGS, "--trigger", "available-now"],
            jvm_profile=JVM_PROFILE,
            outlets=[QUARANTINE_ASSET, GOLD_ASSET, STATUS_ASSET],
        )

    with TaskGroup("continuous") as continuous:
        continuous_args = [*PIPELINE_ARGS, "--trigger", "continuous", "--interval", "{{ params.interval }}"]
        for job in STREAMS:
            SupervisedStreamOperator(
                task_id=job,
                job=job,
                job_args=continuous_args,
                checkpoint=f"{{{{ checkpoint_of(params.pipeline, '{job}') }}}}",
                stall_after=STALL_AFTER,
                retries=5,
                jvm_profile=JVM_PROFILE,
            )
        SupervisedStreamOperator(
            task_id="pipeline",
            job="run",
            job_args=continuous_args,
            checkpoint="{{ checkpoint_of(params.pipeline) }}",
            stall_after=STALL_AFTER,
            retries=5,
            jvm_profile=JVM_PROFILE,
        )

    choose_mode() >> [available_now, continuous]


tidemark_streaming()
