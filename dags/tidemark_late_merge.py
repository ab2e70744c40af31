"""Fold pending quarantined late records into silver and gold (and re-derive the
offline status history of keys with late tracks).

Runs after each silver pass that emits the quarantine Asset and every 5 minutes
(continuous streams emit no Asset). Such a run merges every configured pipeline
with `min_pending` late records waiting, and at the top of each hour every one
with any (a merge task per pipeline). A run triggered from the UI merges its
`pipeline`, with Params: a dry run prints what would change and writes nothing;
a time range limits the merge to windows starting in ``[from, to)``."""

from airflow.sdk import AssetOrTimeSchedule, CronTriggerTimetable, Param, dag, task
from airflow.sdk.types import DagRunProtocol
from tidemark_airflow.merging import pending_late_records, pipelines_due
from tidemark_airflow.operators import (
    BATCH_TIMEOUT,
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
            description="scheduled and Asset-triggered runs merge a pipeline once this many wait",
        ),
    },
    **dag_settings("merge"),
)
def tidemark_late_merge() -> None:
    @task
    def pipelines_to_merge(params: dict | None = None, dag_run: DagRunProtocol | None = None) -> list[str]:
        if dag_run.run_type == "manual":
            return [params["pipeline"]]
        pending = pending_late_records()
        print(", ".join(f"{name}: {count} late records wait" for name, count in pending.items()))
        return pipelines_due(pending, params["min_pending"], dag_run.run_type, dag_run.logical_date)

    @task
    def merge_arguments(pipeline: str, params: dict | None = None) -> list[str]:
        arguments = ["--pipeline", pipeline_file(pipeline)]
        if params["dry_run"]:
            arguments.append("--dry-run")
        for flag in ("from", "to"):
            if params[flag]:
                arguments += [f"--{flag}", params[flag]]
        return arguments

    # A merge task per pipeline due; with none due, the run skips them and ends.
    # (A mapped task takes its deadline from here: the operator's own default is set when it is built.)
    TidemarkJobOperator.partial(
        task_id="merge_late",
        job="merge_late",
        outlets=[GOLD_ASSET, STATUS_ASSET],
        execution_timeout=BATCH_TIMEOUT,
    ).expand(job_args=merge_arguments.expand(pipeline=pipelines_to_merge()))


tidemark_late_merge()
