"""Start and supervise one pipeline's streams: bronze, silver, gold, offline detection.

- **available-now** (the schedule's mode): each job drains its backlog and exits,
  in dependency order; the next scheduled run continues from the checkpoints.
- **continuous** (trigger by hand): the four streams run side by side until
  stopped; a failed stream exits 1 and its task's retries restart it, and a stream
  that is alive but stalled is killed by its watchdog, so the same retries apply.
"""

from datetime import timedelta

from airflow.sdk import Param, TaskGroup, dag, task
from tidemark_airflow.operators import (
    GOLD_ASSET,
    PIPELINE_ARGS,
    STATUS_ASSET,
    SupervisedStreamOperator,
    TidemarkJobOperator,
    dag_settings,
    pipeline_param,
)

STREAMS = ("bronze", "silver", "gold", "offline")


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
    },
    **dag_settings("streaming"),
)
def tidemark_streaming() -> None:
    @task.branch
    def choose_mode(params: dict | None = None) -> list[str]:
        if params["mode"] == "continuous":
            return [f"continuous.{job}" for job in STREAMS]
        return ["available_now.bronze"]

    with TaskGroup("available_now") as available_now:
        drained = {
            job: TidemarkJobOperator(
                task_id=job,
                job=job,
                job_args=[*PIPELINE_ARGS, "--trigger", "available-now"],
                outlets={"gold": [GOLD_ASSET], "offline": [STATUS_ASSET]}.get(job, []),
            )
            for job in STREAMS
        }
        drained["bronze"] >> drained["silver"] >> [drained["gold"], drained["offline"]]

    with TaskGroup("continuous") as continuous:
        for job in STREAMS:
            SupervisedStreamOperator(
                task_id=job,
                job=job,
                job_args=[*PIPELINE_ARGS, "--trigger", "continuous", "--interval", "{{ params.interval }}"],
                checkpoint=f"{{{{ checkpoint_of(params.pipeline, '{job}') }}}}",
                stall_after=timedelta(minutes=15),
                retries=5,
            )

    choose_mode() >> [available_now, continuous]


tidemark_streaming()
