#!/bin/sh
# Resolve Tidemark's jars into $TIDEMARK_JARS_DIR (Delta, the Kafka connector) and compile
# its own beside them at image build time, exactly as `make setup` does natively
# (spark_jobs/jars.py, spark_jobs/java_build.py). With
# WITH_S3=true, also hadoop-aws of pyspark's own Hadoop version (and its AWS SDK
# bundle) onto pyspark's class path, for a lakehouse on object storage (s3a://).
set -eu
python -m spark_jobs.jars spark
python -m spark_jobs.jars token-provider
python -m spark_jobs.java_build
if [ "${WITH_S3:-false}" = "true" ]; then
  spark_jars="$(python -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')"
  hadoop="$(ls "$spark_jars" | sed -n 's/^hadoop-client-api-\(.*\)\.jar$/\1/p')"
  python -c 'import sys; from pathlib import Path; from spark_jobs.jars import resolve; resolve([sys.argv[1]], Path(sys.argv[2]))' \
    "org.apache.hadoop:hadoop-aws:$hadoop" "$(dirname "$TIDEMARK_JARS_DIR")/s3"
  cp "$(dirname "$TIDEMARK_JARS_DIR")"/s3/*.jar "$spark_jars"/
fi
