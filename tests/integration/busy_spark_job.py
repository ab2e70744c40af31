"""A Spark application that keeps a core busy until it is killed: the load beside
the pipeline in tests of what else a busy machine must still do."""

from pyspark.sql import SparkSession

if __name__ == "__main__":
    spark = (
        SparkSession.builder.appName("tidemark-test-load").config("spark.ui.enabled", "false").getOrCreate()
    )
    while True:
        spark.range(50_000_000).selectExpr("sum(hash(id))").collect()
