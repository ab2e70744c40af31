"""The gold store: which (grain, group) keys a set of silver rows touch, and their
gold rows recomputed from silver and written in place of theirs. The gold stream and the late merge
both refresh gold through it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from spark_jobs.eventtime.windows import SessionSpec
from spark_jobs.lakehouse.reads import changed_rows, replaced_rows
from spark_jobs.lakehouse.table_files import Within, read_latest, rewrite_within
from spark_jobs.lakehouse.transaction import retry_on_conflict
from spark_jobs.sql import local_rows, null_safe_match
from spark_jobs.tables import TableRegistry
from spark_jobs.transforms.gold import grain_keys, rolled_up, rollup, silver_start


def changed_keys(silver_rows: DataFrame, registry: TableRegistry) -> list[Row]:
    """(grain start in epoch millis, group_by...) of every gold row ``silver_rows`` touch."""
    group_by = registry.config.gold.group_by
    keys = grain_keys(silver_rows, registry.config)
    return keys.select(F.unix_millis("grain_start").alias("grain_ms"), *group_by).collect()


def feed_keys(changes: DataFrame, registry: TableRegistry) -> list[Row]:
    """The gold keys (:func:`changed_keys`) of the rolled-up rows a batch of silver's
    change feed added or changed. A session can also leave a grain (an earlier record
    moves its start) or stop counting (merged, or reopened by a late record), so for
    sessions the rows as they were before the change count as well; a window never does
    either."""
    touched = rolled_up(changed_rows(changes))
    if isinstance(registry.config.window, SessionSpec):
        touched = touched.unionByName(rolled_up(replaced_rows(changes)))
    return changed_keys(touched, registry)


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
    and write them in place of theirs (a key with none left loses its row), in a commit labelled
    ``label``; returns how many keys were refreshed. Both sides are pruned to the
    keys' grains by their files' statistics, from this process's view of the tables'
    files (no Delta state rebuilt), so the cost follows the keys, not the tables or
    their histories. With ``owner`` (the gold stream's job), a
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

    def merge() -> int:
        wanted = local_rows(spark, list(keys), key_schema).select(
            F.timestamp_millis("grain_ms").alias("grain_start"), *gold.group_by
        )
        in_silver = Within(silver_start(config), lowest, highest)
        in_gold = Within("grain_start", lowest, highest)
        silver, _ = read_latest(spark, registry.silver.path, in_silver)
        fresh = (
            rollup(silver.where(in_silver.condition()), config)
            .join(F.broadcast(wanted), list(columns), "left_semi")
            .withColumn("updated_at", F.lit(now).cast("timestamp"))
        )

        def refreshed(current: DataFrame) -> DataFrame:
            # A key silver no longer rolls up into loses its row: its sessions merged away,
            # moved to an earlier grain, or reopened.
            replaced = F.broadcast(wanted).alias("s")
            kept = current.alias("t").join(replaced, null_safe_match(columns), "left_anti")
            return kept.unionByName(fresh).coalesce(1)

        rewrite_within(spark, registry.gold.path, in_gold, refreshed, label, txn)
        return len(keys)

    return retry_on_conflict(merge, "gold MERGE", (spark, registry.gold.path), owner=owner)
