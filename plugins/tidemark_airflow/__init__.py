"""Tidemark's Airflow code: operators, sensors, lakehouse reads and the UI page."""
