"""Thin job wiring: parse args, build the session, read, transform, write.

Each module here is also a spark-submit entry point (``spark-submit
spark_jobs/jobs/bronze.py --pipeline ...``); spark_jobs.submit builds those
commands with the same settings the session factory uses.
"""
