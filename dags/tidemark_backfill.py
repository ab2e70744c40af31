"""Replay a static JSON-lines or CSV file through the real streaming jobs, in file
order, with controlled micro-batches (``tidemark replay``): a backfill gives the
same answer as live processing. Triggered by hand."""

from airflow.sdk import Param, dag, task
from tidemark_airflow.operators import (
    DEFAULT_ARGS,
    GOLD_ASSET,
    STATUS_ASSET,
    TidemarkJobOperator,
    dag_settings,
    pipeline_file,
    pipeline_param,
)


@dag(
    dag_id="tidemark_backfill",
    schedule=None,
    doc_md=__doc__,
    params={
        "pipeline": pipeline_param(),
        "input": Param(
            "", type="string", minLength=1, description="the file to replay (on the workers' filesystem)"
        ),
        "batch_size": Param(1000, type="integer", minimum=1, description="records per micro-batch"),
        "batch_column": Param(
            None, type=["null", "string"], description="cut batches where this column changes"
        ),
        "flush": Param(False, type="boolean", description="end the input: the watermark moves to +inf"),
    },
    # A replay is not retried blindly: its landing folder and checkpoints are the user's to inspect.
    **dag_settings("backfill", default_args={**DEFAULT_ARGS, "retries": 0}),
)
def tidemark_backfill() -> None:
    @task
    def replay_arguments(params: dict | None = None) -> list[str]:
        arguments = ["--pipeline", pipeline_file(params["pipeline"]), "--input", params["input"]]
        if params["batch_column"]:
            arguments += ["--batch-column", params["batch_column"]]
        else:
            arguments += ["--batch-size", str(params["batch_size"])]
        if params["flush"]:
            arguments.append("--flush")
        return arguments

    TidemarkJobOperator(
        task_id="replay", job="replay", job_args=replay_arguments(), outlets=[GOLD_ASSET, STATUS_ASSET]
    )


tidemark_backfill()
