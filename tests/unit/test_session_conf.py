"""The session factory's settings (what spark-submit passes as --conf too)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from spark_jobs import jvm, session
from spark_jobs.jobs import common, replay, silver
from spark_jobs.jvm import DUMP_VARIABLE
from spark_jobs.session import (
    DEFAULT_PARALLELISM,
    JVM_PROFILE_VARIABLE,
    JVM_PROFILES,
    ONE_PARTITION_RECORDS,
    SHORT_JOB_RECORDS,
    SHUFFLE_PARTITIONS,
    SHUFFLE_PARTITIONS_VARIABLE,
    profile_for_records,
    spark_conf,
)
from spark_jobs.sql_client import BEELINE_JAVA_OPTIONS
from spark_jobs.submit import submit_command
from tests.unit.test_config import PIPELINES


def test_jobs_start_without_the_spark_ui_unless_asked_for_it(monkeypatch):
    monkeypatch.delenv("TIDEMARK_SPARK_UI", raising=False)
    assert spark_conf()["spark.ui.enabled"] == "false"
    monkeypatch.setenv("TIDEMARK_SPARK_UI", "true")
    assert spark_conf()["spark.ui.enabled"] == "true"


def test_a_driver_maps_the_class_archive_when_setup_built_one(monkeypatch, tmp_path):
    monkeypatch.delenv(DUMP_VARIABLE, raising=False)
    archive = tmp_path / "spark-classes.jsa"
    monkeypatch.setattr(jvm, "archive_path", lambda: archive)
    assert "SharedArchiveFile" not in spark_conf()["spark.driver.extraJavaOptions"]
    archive.write_bytes(b"archive")
    options = spark_conf()["spark.driver.extraJavaOptions"]
    assert f"-XX:SharedArchiveFile={archive} -Xshare:auto" in options
    assert "SharedArchiveFile" not in spark_conf()["spark.executor.extraJavaOptions"]


def test_the_training_run_writes_the_archive_instead_of_mapping_it(monkeypatch, tmp_path):
    monkeypatch.setenv(DUMP_VARIABLE, str(tmp_path / "new.jsa"))
    options = spark_conf()["spark.driver.extraJavaOptions"]
    assert f"-XX:ArchiveClassesAtExit={tmp_path / 'new.jsa'}" in options
    assert "SharedArchiveFile" not in options


def test_the_default_jvm_profile_leaves_the_jdks_compiler_and_collector(monkeypatch):
    monkeypatch.delenv(JVM_PROFILE_VARIABLE, raising=False)
    conf = spark_conf()
    for side in ("driver", "executor"):
        assert "TieredStopAtLevel" not in conf[f"spark.{side}.extraJavaOptions"]
        assert "UseSerialGC" not in conf[f"spark.{side}.extraJavaOptions"]
    assert "spark.sql.codegen.factoryMode" not in conf


def test_the_short_jobs_profile_gives_driver_and_executors_c1_and_the_parallel_collector(monkeypatch):
    monkeypatch.setenv(JVM_PROFILE_VARIABLE, "short-jobs")
    conf = spark_conf()
    for side in ("driver", "executor"):
        options = conf[f"spark.{side}.extraJavaOptions"].split()
        assert {"-XX:TieredStopAtLevel=1", "-XX:+UseParallelGC"} <= set(options)
        assert "-Duser.timezone=UTC" in options


def java_flag(options: str, flag: str) -> int:
    """The value the JVM settles on for ``flag`` when started with ``options``."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    command = [java, *options.split(), "-XX:+PrintFlagsFinal", "-version"]
    printed = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return int(re.search(rf"\b{flag}\s+= (\d+)", printed).group(1))


def test_a_short_jobs_jvm_keeps_a_code_cache_that_minutes_of_spark_do_not_fill():
    # C1 alone would shrink it to 48 MB, and evict and compile again once it is full.
    assert java_flag(JVM_PROFILES["short-jobs"].java_options, "ReservedCodeCacheSize") >= 240 * 2**20


def test_a_short_jobs_jvm_compiles_code_after_a_sixth_of_the_calls_and_loops_the_jdk_waits_for():
    short_jobs = JVM_PROFILES["short-jobs"].java_options
    for flag in ("Tier3InvocationThreshold", "Tier3CompileThreshold", "Tier3BackEdgeThreshold"):
        assert java_flag(short_jobs, flag) * 6 <= java_flag("", flag)


def test_a_short_jobs_spark_jvm_leaves_room_for_sparks_class_metadata_before_a_full_collection(monkeypatch):
    monkeypatch.setenv(JVM_PROFILE_VARIABLE, "short-jobs")
    for side in ("driver", "executor"):
        options = spark_conf()[f"spark.{side}.extraJavaOptions"]
        assert java_flag(options, "MetaspaceSize") >= 256 * 2**20 > java_flag("", "MetaspaceSize")


def test_a_short_jobs_spark_jvm_starts_with_the_whole_heap_spark_gives_it(monkeypatch):
    # Grown from a small start, the serial collector runs hundreds of collections in
    # a short job's first minute; the maximum is Spark's (-Xmx from its memory setting).
    monkeypatch.setenv(JVM_PROFILE_VARIABLE, "short-jobs")
    for side in ("driver", "executor"):
        options = f"{spark_conf()[f'spark.{side}.extraJavaOptions']} -Xmx1g"
        assert java_flag(options, "InitialHeapSize") == java_flag(options, "MaxHeapSize") == 2**30


def test_beeline_gets_the_short_jobs_compilers_but_grows_its_heap_from_the_jdks_start():
    # beeline has no -Xmx of Spark's: a whole-heap start would reserve a quarter of the machine.
    assert "-XX:TieredStopAtLevel=1" in BEELINE_JAVA_OPTIONS.split()
    assert java_flag(BEELINE_JAVA_OPTIONS, "InitialHeapSize") < java_flag(BEELINE_JAVA_OPTIONS, "MaxHeapSize")


def test_the_short_jobs_profile_interprets_expressions_instead_of_compiling_them(monkeypatch):
    monkeypatch.setenv(JVM_PROFILE_VARIABLE, "short-jobs")
    assert spark_conf()["spark.sql.codegen.factoryMode"] == "NO_CODEGEN"


def test_an_unknown_jvm_profile_is_an_error_naming_the_variable_and_the_choices(monkeypatch):
    monkeypatch.setenv(JVM_PROFILE_VARIABLE, "fast")
    with pytest.raises(ValueError, match=r"TIDEMARK_JVM_PROFILE='fast'.*throughput, short-jobs"):
        spark_conf()


def test_a_jobs_default_profile_applies_when_the_variable_is_unset(monkeypatch):
    monkeypatch.delenv(JVM_PROFILE_VARIABLE, raising=False)
    conf = spark_conf(default_profile="short-jobs")
    assert "-XX:TieredStopAtLevel=1" in conf["spark.driver.extraJavaOptions"].split()
    assert conf["spark.sql.codegen.factoryMode"] == "NO_CODEGEN"


def test_the_variable_overrides_a_jobs_default_profile(monkeypatch):
    monkeypatch.setenv(JVM_PROFILE_VARIABLE, "throughput")
    conf = spark_conf(default_profile="short-jobs")
    assert "TieredStopAtLevel" not in conf["spark.driver.extraJavaOptions"]
    assert "spark.sql.codegen.factoryMode" not in conf


def test_a_profile_chosen_for_the_job_overrides_the_variable(monkeypatch):
    monkeypatch.setenv(JVM_PROFILE_VARIABLE, "short-jobs")
    conf = spark_conf(chosen_profile="throughput")
    assert "TieredStopAtLevel" not in conf["spark.driver.extraJavaOptions"]
    assert "spark.sql.codegen.factoryMode" not in conf


def test_an_unknown_chosen_profile_is_an_error_naming_the_choices(monkeypatch):
    monkeypatch.setenv(JVM_PROFILE_VARIABLE, "throughput")
    with pytest.raises(ValueError, match=r"the job's profile='fast'.*throughput, short-jobs"):
        spark_conf(chosen_profile="fast")


def test_an_input_of_up_to_the_short_job_size_gets_short_jobs_and_a_larger_one_throughput():
    assert profile_for_records(24) == "short-jobs"
    assert profile_for_records(SHORT_JOB_RECORDS) == "short-jobs"
    assert profile_for_records(SHORT_JOB_RECORDS + 1) == "throughput"


ONE_PARTITION = {SHUFFLE_PARTITIONS: "1", DEFAULT_PARALLELISM: "1"}


@pytest.mark.parametrize(
    ("lines", "profile", "partitioning"),
    [
        (24, "short-jobs", ONE_PARTITION),
        (ONE_PARTITION_RECORDS, "short-jobs", ONE_PARTITION),
        (ONE_PARTITION_RECORDS + 1, "short-jobs", {}),
        (SHORT_JOB_RECORDS + 1, "throughput", {}),
    ],
)
def test_replay_sizes_its_jvm_profile_and_partitions_to_its_input(
    monkeypatch, tmp_path, lines, profile, partitioning
):
    asked = {}

    def no_spark(app_name: str, **settings: object) -> None:
        asked.update(settings)
        raise SystemExit(0)

    monkeypatch.delenv(SHUFFLE_PARTITIONS_VARIABLE, raising=False)
    monkeypatch.setattr(session, "build_session", no_spark)
    record = '{"device_id": "d1", "ts": 1767225600000, "region": "north", "partition": 1}\n'
    (tmp_path / "in.json").write_text(record * lines)
    with pytest.raises(SystemExit):
        replay.main(["--pipeline", str(PIPELINES / "telemetry.yaml"), "--input", str(tmp_path / "in.json")])
    assert asked == {"default_profile": profile, "overrides": partitioning}


def test_a_small_inputs_single_partition_gives_way_to_the_variable(monkeypatch):
    monkeypatch.setenv(SHUFFLE_PARTITIONS_VARIABLE, "6")
    assert session.conf_for_records(24) == {}
    assert spark_conf(local=True, overrides=session.conf_for_records(24))[SHUFFLE_PARTITIONS] == "6"


def submitted_java_options(job: str, *job_args: str, master: str | None = None) -> list[str]:
    command = submit_command(job, list(job_args), master=master)
    [options] = [arg.split("=", 1)[1] for arg in command if arg.startswith("spark.driver.extraJavaOptions=")]
    return options.split()


@pytest.mark.parametrize(
    ("job", "job_args", "c1_only"),
    [
        ("run", ("--pipeline", "p", "--trigger", "continuous"), True),
        ("silver", ("--pipeline", "p"), True),  # a stream job is continuous unless told otherwise
        ("bronze", ("--pipeline", "p", "--trigger=continuous", "--interval", "1s"), True),
        ("run", ("--pipeline", "p", "--trigger", "available-now", "--flush"), False),
        ("gold", ("--trigger=available-now", "--pipeline", "p"), False),
        ("merge_late", ("--pipeline", "p"), False),  # no stream: its input may be any size
        ("maintenance", ("--pipeline", "p", "--trigger", "continuous"), False),
    ],
)
def test_a_continuous_stream_is_submitted_under_short_jobs_and_the_rest_under_the_default(
    monkeypatch, job, job_args, c1_only
):
    monkeypatch.delenv(JVM_PROFILE_VARIABLE, raising=False)
    assert ("-XX:TieredStopAtLevel=1" in submitted_java_options(job, *job_args)) is c1_only


def test_a_continuous_stream_on_a_cluster_keeps_the_default_profile(monkeypatch, tmp_path):
    monkeypatch.delenv(JVM_PROFILE_VARIABLE, raising=False)
    monkeypatch.setenv("TIDEMARK_CACHE_DIR", str(tmp_path))  # where the shipped package zip goes
    options = submitted_java_options("run", "--pipeline", "p", master="spark://10.0.0.7:7077")
    assert "-XX:TieredStopAtLevel=1" not in options


def test_the_variable_overrides_a_continuous_streams_profile(monkeypatch):
    monkeypatch.setenv(JVM_PROFILE_VARIABLE, "throughput")
    assert "-XX:TieredStopAtLevel=1" not in submitted_java_options("run", "--pipeline", "p")


@pytest.mark.parametrize(
    ("trigger", "profile"), [("continuous", "short-jobs"), ("available-now", "throughput")]
)
def test_a_stream_job_run_in_this_process_asks_for_its_triggers_profile(monkeypatch, trigger, profile):
    asked = {}

    def no_spark(app_name: str, **settings: object) -> None:
        asked.update(settings)
        raise SystemExit(0)

    monkeypatch.setattr(common, "build_session", no_spark)
    with pytest.raises(SystemExit):
        silver.main(["--pipeline", str(PIPELINES / "telemetry.yaml"), "--trigger", trigger])
    assert asked == {"default_profile": profile}


def test_an_s3_endpoint_from_the_environment_is_reached_path_style_over_the_scheme_it_names():
    from spark_jobs import object_store

    conf = object_store.spark_conf({"TIDEMARK_S3_ENDPOINT": "http://127.0.0.1:8333"})
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:8333"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    secure = object_store.spark_conf({"TIDEMARK_S3_ENDPOINT": "https://s3.example.org"})
    assert secure["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "true"


def test_without_an_endpoint_s3a_goes_to_aws_and_still_commits_through_the_put_if_absent_store():
    from spark_jobs import object_store

    conf = object_store.spark_conf({})
    assert not any(key.startswith("spark.hadoop.fs.s3a.") for key in conf)
    assert conf["spark.delta.logStore.s3a.impl"] == "io.tidemark.fs.ObjectStoreLogStore"
