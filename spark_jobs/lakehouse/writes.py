"""Session settings that label Delta commits and make Delta's own DML idempotent
(transaction ids)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from pyspark.sql import SparkSession


@contextmanager
def session_settings(spark: SparkSession, settings: dict[str, str]) -> Iterator[None]:
    """``settings`` on the session for the enclosed writes only."""
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key in settings:
            spark.conf.unset(key)


# The session setting that labels a Delta commit, so a writer can find its own
# commit in the table's log again.
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


def txn_settings(app_id: str, version: int) -> dict[str, str]:
    """The session settings that make Delta DML (MERGE, UPDATE) idempotent: Delta
    skips it when this (app id, version) already committed to the table."""
    return {
        "spark.databricks.delta.write.txnAppId": app_id,
        "spark.databricks.delta.write.txnVersion": str(version),
    }


def delta_txn(spark: SparkSession, app_id: str, version: int) -> AbstractContextManager[None]:
    """Make the enclosed Delta DML idempotent (:func:`txn_settings`)."""
    return session_settings(spark, txn_settings(app_id, version))
