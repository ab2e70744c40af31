"""Fold pending quarantined late records into silver and gold (and re-derive the
offline status history of keys with late tracks).

Runs after each silver pass that emits the quarantine Asset and every 5 minutes
(continuous streams emit no Asset); those runs merge once `min_pending` late
records wait, and at the top of each hour whatever waits. A run triggered from
the UI always merges, with Params: a dry run prints what would change and writes
nothing; a time range limits the merge to windows starting in ``[from, to)``."""

from datetime import timedelta

from airflow.sdk import AssetOrTimeSchedule, CronTriggerTimetable, Param, dag, task
from airflow.sdk.types import DagRunProtocol
from tidemark_airflow.merging import merge_due, pending_late_records
from tidemark_airflow.operators import (
    DEFAULT_ARGS,
    GOLD_ASSET,
    QUARANTINE_ASSET,
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
    schedule=AssetOrTimeSchedule(
        timetable=CronTriggerTimetable("*/5 * * * *", timezone="UTC"), assets=QUARANTINE_ASSET
    ),
    doc_md=__doc__,
    params={
        "pipeline": pipeline_param(),
        "dry_run": Param(False, type="boolean", description="print what would change; write nothing"),
        "from": time_bound("only windows starting at or after (ISO-8601)"),
        "to": time_bound("only windows starting before (ISO-8601)"),
        "min_pending": Param(
            25,
            type="integer",
            minimum=0,
            description="scheduled and Asset-triggered runs merge once this many late records wait",
        ),
    },
    **dag_settings("merge", default_args={**DEFAULT_ARGS, "retry_delay": timedelta(minutes=1)}),
)
def tidemark_late_merge() -> None:
    @task.short_circuit
    def late_data_waits(params: dict | None = None, dag_run: DagRunProtocol | None = None) -> bool:
        pending = pending_late_records(params["pipeline"])
        print(f"{pending} late records wait")
        return merge_due(pending, params["min_pending"], dag_run.run_type, dag_run.logical_date)

    @task
    def merge_arguments(params: dict | None = None) -> list[str]:
        arguments = ["--pipeline", pipeline_file(params["pipeline"])]
        if params["dry_run"]:
            arguments.append("--dry-run")
        for flag in ("from", "to"):
            if params[flag]:
                arguments += [f"--{flag}", params[flag]]
        return arguments

    arguments = merge_arguments()
    late_data_waits() >> arguments
    TidemarkJobOperator(
        task_id="merge_late",
        job="merge_late",
        job_args=arguments,
        outlets=[GOLD_ASSET, STATUS_ASSET],
    )


tidemark_late_merge()
