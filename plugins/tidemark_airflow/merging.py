"""Which pipelines a late-merge run folds in: the rule the late-merge DAG applies."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime


def merge_due(pending: int, min_pending: int, run_type: str, logical_date: datetime | None) -> bool:
    """Whether a scheduled or asset-triggered run merges a pipeline: once
    ``min_pending`` late records wait, and on the tick at the top of each hour
    whatever waits, so a trickle is folded in within the hour; with nothing waiting
    there is nothing to do."""
    at_top_of_hour = run_type == "scheduled" and logical_date is not None and logical_date.minute == 0
    return pending >= max(min_pending, 1) or (pending > 0 and at_top_of_hour)


def pipelines_due(
    pending: Mapping[str, int], min_pending: int, run_type: str, logical_date: datetime | None
) -> list[str]:
    """The pipelines (of ``pending``: name -> late records waiting) a scheduled or
    asset-triggered run merges, by :func:`merge_due`. Such runs carry no pipeline:
    an Asset event says that some silver pass quarantined records, not whose."""
    return [name for name, count in pending.items() if merge_due(count, min_pending, run_type, logical_date)]


def pending_late_records() -> dict[str, int]:
    """Late records not yet merged, per configured pipeline; one whose file does not
    load is left out (and said so), so it holds up no other."""
    from spark_jobs.config import ConfigError, load_pipeline
    from spark_jobs.tables import lakehouse_root
    from tidemark_airflow.lakehouse import pending_late, quarantine_backlog
    from tidemark_airflow.operators import pipeline_files

    root = lakehouse_root()
    pending = {}
    for name, file in pipeline_files().items():
        try:
            config = load_pipeline(file)
        except (ConfigError, OSError) as error:
            print(f"{name}: skipped, its pipeline file does not load: {error}")
            continue
        pending[name] = pending_late(quarantine_backlog(root, config.name))
    return pending
