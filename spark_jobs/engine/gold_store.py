"""The gold store: which (grain, group) keys a set of silver rows touch, and their
gold rows recomputed from silver and MERGEd. The gold stream and the late merge
both refresh gold through it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from spark_jobs.lakehouse.transaction import insert_into_empty, read_latest, retry_on_conflict
from spark_jobs.lakehouse.writes import USER_METADATA, session_settings, txn_settings
from spark_jobs.sql import local_rows, null_safe_match
from spark_jobs.tables import TableRegistry
from spark_jobs.transforms.gold import grain_keys, rollup


def changed_keys(silver_rows: DataFrame, registry: TableRegistry) -> list[Row]:
    """(grain start in epoch millis, group_by...) of every gold row ``silver_rows`` touch."""
    group_by = registry.config.gold.group_by
    keys = grain_keys(silver_rows, registry.config)
    return keys.select(F.unix_millis("grain_start").alias("grain_ms"), *group_by).collect()


def refresh_gold(
    spark: SparkSession,
    registry: TableRegistry,
    keys: Sequence[Row],
    now: datetime,
    label: str,
    txn: tuple[str, int] | None = None,
    owner: str | None = None,
) -> int | None:
    """Recompute the gold rows of ``keys`` (from :func:`changed_keys`) from silver
    and MERGE them, in a commit labelled ``label``; returns how many keys were
    refreshed. Both sides of the MERGE are pruned to the keys' grains, so the cost
    follows the keys, not the tables. With ``owner`` (the gold stream's job), a
    conflict with a commit of that stream hands the keys over to it and returns
    None: it follows silver's change feed, so it refreshes them from silver itself."""
    if not keys:
        return 0
    config = registry.config
    gold = config.gold
    columns = ("grain_start", *gold.group_by)
    key_schema = StructType([StructField("grain_ms", LongType(), False), *registry.key_fields(gold.group_by)])
    lowest = datetime.fromtimestamp(min(key.grain_ms for key in keys) / 1000, UTC)
    highest = datetime.fromtimestamp((max(key.grain_ms for key in keys) + gold.grain_ms) / 1000, UTC)
    settings = {USER_METADATA: label, **(txn_settings(*txn) if txn else {})}

    def merge() -> int:
        wanted = local_rows(spark, list(keys), key_schema).select(
            F.timestamp_millis("grain_ms").alias("grain_start"), *gold.group_by
        )
        silver = read_latest(spark, registry.silver.path)[0].where(
            (F.col("window_start") >= F.lit(lowest)) & (F.col("window_start") < F.lit(highest))
        )
        fresh = (
            rollup(silver, config)
            .join(F.broadcast(wanted), list(columns), "left_semi")
            .withColumn("updated_at", F.lit(now).cast("timestamp"))
        )
        if insert_into_empty(spark, registry.gold.path, fresh, label, txn):
            return len(keys)
        in_grains = (F.col("t.grain_start") >= F.lit(lowest)) & (F.col("t.grain_start") < F.lit(highest))
        condition = in_grains & null_safe_match(columns)
        statement = (
            DeltaTable.forPath(spark, registry.gold.path)
            .alias("t")
            .merge(fresh.alias("s"), condition)
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
        )
        with session_settings(spark, settings):
            statement.execute()
        return len(keys)

    return retry_on_conflict(merge, "gold MERGE", (spark, registry.gold.path), owner=owner)
