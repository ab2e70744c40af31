"""Daily table care: OPTIMIZE (compaction) and VACUUM of every Delta table of the
pipeline and the shared ops tables; the task log lists each streaming
checkpoint's size."""

from airflow.sdk import Param, dag
from tidemark_airflow.operators import (
    PIPELINE_ARGS,
    TidemarkJobOperator,
    dag_settings,
    pipeline_param,
)


@dag(
    dag_id="tidemark_maintenance",
    schedule="@daily",
    doc_md=__doc__,
    params={
        "pipeline": pipeline_param(),
        "retain": Param(
            "168h", type="string", description="history VACUUM keeps; longer than any stream's lag"
        ),
    },
    **dag_settings("maintenance"),
)
def tidemark_maintenance() -> None:
    TidemarkJobOperator(
        task_id="optimize_and_vacuum",
        job="maintenance",
        job_args=[*PIPELINE_ARGS, "--retain", "{{ params.retain }}"],
    )


tidemark_maintenance()
