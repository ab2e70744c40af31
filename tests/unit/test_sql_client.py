"""The environment ``tidemark sql`` runs beeline in."""

from __future__ import annotations

from spark_jobs.session import JVM_PROFILES
from spark_jobs.sql_client import beeline_environment

# A JVM of one query: the short-jobs compilers, and the serial collector.
SHORT_JOB_OPTIONS = f"{JVM_PROFILES['short-jobs'].java_options} -XX:+UseSerialGC"


def test_beeline_starts_its_jvm_as_a_short_job():
    environment = beeline_environment({"PATH": "/bin"})
    assert environment == {"PATH": "/bin", "SPARK_BEELINE_OPTS": SHORT_JOB_OPTIONS}


def test_the_callers_own_beeline_options_come_after_the_short_job_ones():
    environment = beeline_environment({"SPARK_BEELINE_OPTS": "-Xmx2g -XX:+UseG1GC"})
    assert environment["SPARK_BEELINE_OPTS"] == f"{SHORT_JOB_OPTIONS} -Xmx2g -XX:+UseG1GC"
