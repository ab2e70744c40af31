"""Claims on a side output's pending rows (the quarantine, offline detection's late
tracks): a merge run marks the rows it will fold in with its id, and marks them
merged once folded. Each step rewrites only the pending files it read, so the
stream appending new pending rows beside it never conflicts with it."""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.lakehouse.transaction import Rewrite, retry_on_conflict, rewrite_files
from spark_jobs.sql import is_in_sql, string_literal

PENDING, MERGED = "pending", "merged"


def unclaimed(in_range: str) -> str:
    """SQL: a pending row that no run has claimed, where ``in_range`` (SQL) holds."""
    return f"status = '{PENDING}' AND merge_run_id IS NULL AND ({in_range})"


def claimed_by(*run_ids: str) -> str:
    """SQL: a pending row that one of the runs ``run_ids`` claimed."""
    return f"status = '{PENDING}' AND {is_in_sql('merge_run_id', run_ids)}"


def of_run(run_id: str) -> str:
    """SQL: a row run ``run_id`` claimed, merged since or not."""
    return f"merge_run_id = {string_literal(run_id)}"


# SQL: a pending row some run claimed.
CLAIMED = f"status = '{PENDING}' AND merge_run_id IS NOT NULL"
# The label of a claim's commit, before the run's id.
CLAIM_LABEL = "tidemark-claim:"


def is_claim(label: str | None) -> bool:
    """Whether a commit's label is a claim's."""
    return bool(label) and label.startswith(CLAIM_LABEL)


def claim(spark: SparkSession, path: str, run_id: str, in_range: str) -> Rewrite | None:
    """Mark the unclaimed pending rows ``in_range`` as run ``run_id``'s, in a commit
    labelled :data:`CLAIM_LABEL` and ``run_id`` (None: nothing pending to claim)."""
    rule = unclaimed(in_range)

    def mark(rows: DataFrame) -> DataFrame:
        return rows.withColumn(
            "merge_run_id", F.when(F.expr(rule), F.lit(run_id)).otherwise(F.col("merge_run_id"))
        )

    label = CLAIM_LABEL + run_id
    return retry_on_conflict(lambda: rewrite_files(spark, path, rule, mark, label), "claim", (spark, path))


def mark_merged(spark: SparkSession, path: str, rule: str, now: datetime, label: str) -> Rewrite | None:
    """Mark the pending rows where ``rule`` (SQL: :func:`claimed_by`, :data:`CLAIMED`)
    holds as merged at ``now`` (None: none were left)."""

    def merged(rows: DataFrame) -> DataFrame:
        chosen = F.expr(rule)
        return rows.withColumn(
            "merged_at", F.when(chosen, F.lit(now).cast("timestamp")).otherwise(F.col("merged_at"))
        ).withColumn("status", F.when(chosen, F.lit(MERGED)).otherwise(F.col("status")))

    return retry_on_conflict(
        lambda: rewrite_files(spark, path, rule, merged, label), f"marking {label}", (spark, path)
    )
