"""Source readers: each returns a streaming DataFrame of raw records with their
source coordinates (see spark_jobs.transforms.parse for the column contract)."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from spark_jobs.lakehouse.log import Commit, commits, table_version
from spark_jobs.sources.progress import REPORT_LOOKBACK, SourceProgress
from spark_jobs.tables import TableRegistry


def read_source(spark: SparkSession, registry: TableRegistry) -> DataFrame:
    config = registry.config
    if config.source.kind == "kafka":
        from spark_jobs.sources.kafka import read_kafka

        return read_kafka(spark, config)
    from spark_jobs.sources.files import read_landing

    return read_landing(spark, config, registry.landing_path, registry.archive_path)


def source_reports(
    spark: SparkSession, registry: TableRegistry, first: int, latest: int
) -> dict[int, SourceProgress]:
    """What the source reported with each bronze version from ``first`` to ``latest``,
    read from the bronze commits themselves, on the driver."""
    return {commit.version: report for commit, report in _reports(spark, registry, first, latest)}


def latest_source_report(
    spark: SparkSession, registry: TableRegistry
) -> tuple[Commit, SourceProgress] | None:
    """Bronze's last batch's source report and its commit, or None before its first."""
    latest = table_version(spark, registry.bronze.path)
    found = _reports(spark, registry, latest - REPORT_LOOKBACK, latest)
    return found[-1] if found else None


def _reports(
    spark: SparkSession, registry: TableRegistry, first: int, latest: int
) -> list[tuple[Commit, SourceProgress]]:
    if latest < 0:
        return []
    found = []
    for commit in commits(spark, registry.bronze.path, first, latest):
        report = SourceProgress.from_metadata(commit.user_metadata)
        if report is not None:
            found.append((commit, report))
    return found
