"""When a late merge is worth its Spark job: the rule the late-merge DAG's gate applies."""

from __future__ import annotations

from datetime import datetime


def merge_due(pending: int, min_pending: int, run_type: str, logical_date: datetime | None) -> bool:
    """A run someone triggered always merges. A scheduled or asset-triggered one
    merges once ``min_pending`` late records wait, and on the tick at the top of each
    hour whatever waits, so a trickle is folded in within the hour; with nothing
    waiting there is nothing to do."""
    if run_type == "manual":
        return True
    at_top_of_hour = run_type == "scheduled" and logical_date is not None and logical_date.minute == 0
    return pending >= max(min_pending, 1) or (pending > 0 and at_top_of_hour)


def pending_late_records(pipeline_name: str) -> int:
    """Quarantined late records of the configured pipeline not yet merged."""
    from spark_jobs.config import load_pipeline
    from spark_jobs.tables import lakehouse_root
    from tidemark_airflow.lakehouse import pending_late, quarantine_backlog
    from tidemark_airflow.operators import pipeline_file

    config = load_pipeline(pipeline_file(pipeline_name))
    return pending_late(quarantine_backlog(lakehouse_root(), config.name))
