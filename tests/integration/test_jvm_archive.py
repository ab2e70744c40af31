"""The class archive ``make setup`` builds is the one a spark-submitted job maps."""

from __future__ import annotations

import subprocess

import pytest

from spark_jobs.jvm import archive_path
from spark_jobs.session import JVM_PROFILE_VARIABLE, JVM_PROFILES, spark_conf
from spark_jobs.submit import spark_submit_binary, submit_env

pytestmark = [pytest.mark.spark]

PROBE = """
from spark_jobs.session import build_session
spark = build_session("tidemark-archive-probe")
spark.range(3).count()
runtime = spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
print("JVM:", " ".join(runtime.getInputArguments()))
print("expressions:", spark.conf.get("spark.sql.codegen.factoryMode"))
"""


@pytest.mark.parametrize("profile", sorted(JVM_PROFILES))
def test_a_spark_submitted_driver_maps_sparks_classes_from_the_setup_archive_under_each_jvm_profile(
    profile, tmp_path, monkeypatch
):
    assert archive_path().is_file(), "make setup builds the archive"
    monkeypatch.setenv(JVM_PROFILE_VARIABLE, profile)
    conf = spark_conf(local=True)
    # -Xshare:on turns an archive the JVM cannot use (another class path, another
    # Java) from a silent fallback into a failed start.
    classes = tmp_path / "classes.log"
    java_options = f"{conf['spark.driver.extraJavaOptions']} -Xshare:on -Xlog:class+load=info:file={classes}"
    command = [spark_submit_binary(), "--master", "local[1]"]
    for key, value in {**conf, "spark.driver.extraJavaOptions": java_options}.items():
        command += ["--conf", f"{key}={value}"]
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    done = subprocess.run(
        [*command, str(probe)], env=submit_env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    arguments = next(line for line in done.stdout.splitlines() if line.startswith("JVM:")).split()
    assert ("-XX:TieredStopAtLevel=1" in arguments) == (profile == "short-jobs")
    expressions = next(line for line in done.stdout.splitlines() if line.startswith("expressions:"))
    assert expressions.split()[1] == ("NO_CODEGEN" if profile == "short-jobs" else "FALLBACK")
    loaded = classes.read_text()
    assert "org.apache.spark.SparkContext source: shared objects file (top)" in loaded
    assert "org.apache.spark.sql.SparkSession source: shared objects file (top)" in loaded
