"""Source readers: each returns a streaming DataFrame of raw records with their
source coordinates (see spark_jobs.transforms.parse for the column contract)."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from spark_jobs.tables import TableRegistry


def read_source(spark: SparkSession, registry: TableRegistry) -> DataFrame:
    config = registry.config
    if config.source.kind == "kafka":
        from spark_jobs.sources.kafka import read_kafka

        return read_kafka(spark, config)
    from spark_jobs.sources.files import read_landing

    return read_landing(spark, config, registry.landing_path)
