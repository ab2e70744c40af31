#!/bin/sh
# Resolve Tidemark's jars into $TIDEMARK_JARS_DIR (Delta, the Kafka connector) and beside
# it (S3A, for a lakehouse on s3a://), and compile its own, at image build time, exactly
# as `make setup` does natively (spark_jobs/jars.py, spark_jobs/java_build.py).
set -eu
python -m spark_jobs.jars spark token-provider s3a
python -m spark_jobs.java_build
