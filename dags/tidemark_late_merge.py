"""Fold pending quarantined late records into silver and gold (and re-derive the
offline status history of keys with late tracks). Hourly, and from the UI with
Params: a dry run prints what would change and writes nothing; a time range
limits the merge to windows starting in ``[from, to)``."""

from datetime import timedelta

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


def time_bound(description: str) -> Param:
    """An optional bound of the merge's range; the trigger form offers a date-time picker."""
    return Param(None, type=["null", "string"], format="date-time", description=description)


@dag(
    dag_id="tidemark_late_merge",
    schedule="@hourly",
    doc_md=__doc__,
    params={
        "pipeline": pipeline_param(),
        "dry_run": Param(False, type="boolean", description="print what would change; write nothing"),
        "from": time_bound("only windows starting at or after (ISO-8601)"),
        "to": time_bound("only windows starting before (ISO-8601)"),
    },
    **dag_settings("merge", default_args={**DEFAULT_ARGS, "retry_delay": timedelta(minutes=1)}),
)
def tidemark_late_merge() -> None:
    @task
    def merge_arguments(params: dict | None = None) -> list[str]:
        arguments = ["--pipeline", pipeline_file(params["pipeline"])]
        if params["dry_run"]:
            arguments.append("--dry-run")
        for flag in ("from", "to"):
            if params[flag]:
                arguments += [f"--{flag}", params[flag]]
        return arguments

    TidemarkJobOperator(
        task_id="merge_late",
        job="merge_late",
        job_args=merge_arguments(),
        outlets=[GOLD_ASSET, STATUS_ASSET],
    )


tidemark_late_merge()
