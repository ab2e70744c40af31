"""Tidemark: Flink-grade event-time streaming on Spark and Delta Lake."""

__version__ = "0.1.0"
