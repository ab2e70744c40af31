"""Daily table care: OPTIMIZE (compaction) and VACUUM of every Delta table of the
pipeline and the shared ops tables; the task log lists each streaming
checkpoint's size."""

from datetime import datetime

from airflow.sdk import Param, dag
from tidemark_airflow.operators import (
    DEFAULT_ARGS,
    MACROS,
    PIPELINE_ARGS,
    TidemarkJobOperator,
    pipeline_param,
)


@dag(
    dag_id="tidemark_maintenance",
    schedule="@daily",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    user_defined_macros=MACROS,
    tags=["tidemark", "maintenance"],
    doc_md=__doc__,
    params={
        "pipeline": pipeline_param(),
        "retain": Param(
            "168h", type="string", description="history VACUUM keeps; longer than any stream's lag"
        ),
    },
)
def tidemark_maintenance() -> None:
    TidemarkJobOperator(
        task_id="optimize_and_vacuum",
        job="maintenance",
        job_args=[*PIPELINE_ARGS, "--retain", "{{ params.retain }}"],
    )


tidemark_maintenance()
