"""Tidemark's Airflow code: operators, sensors, lakehouse reads and the UI page."""

# The Spark connection every Tidemark operator submits through.
SPARK_CONN_ID = "tidemark_spark"
