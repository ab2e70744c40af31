"""Every few minutes: mark idle partitions, advance the watermark of quiet streams
(due windows fire; the streams then fire due timers), and fail when a stream is
stalled with a backlog, so it shows red in the UI."""

from datetime import timedelta

from airflow.sdk import Param, dag
from tidemark_airflow.operators import (
    DEFAULT_ARGS,
    PIPELINE_ARGS,
    TidemarkJobOperator,
    dag_settings,
    pipeline_param,
)


@dag(
    dag_id="tidemark_idleness_check",
    schedule=timedelta(minutes=5),
    doc_md=__doc__,
    params={
        "pipeline": pipeline_param(),
        "stall_after": Param(
            "5m", type="string", description="a backlog older than this is a stalled stream"
        ),
    },
    # A stalled stream is the finding, not a transient error: no retries.
    **dag_settings("idleness", default_args={**DEFAULT_ARGS, "retries": 0}),
)
def tidemark_idleness_check() -> None:
    TidemarkJobOperator(
        task_id="check_idle",
        job="check_idle",
        job_args=[*PIPELINE_ARGS, "--stall-after", "{{ params.stall_after }}"],
    )


tidemark_idleness_check()
