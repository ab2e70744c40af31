"""The session factory's settings (what spark-submit passes as --conf too)."""

from __future__ import annotations

import pytest

from spark_jobs import jvm_archive
from spark_jobs.jvm_archive import DUMP_VARIABLE
from spark_jobs.session import JVM_PROFILE_VARIABLE, spark_conf


def test_jobs_start_without_the_spark_ui_unless_asked_for_it(monkeypatch):
    monkeypatch.delenv("TIDEMARK_SPARK_UI", raising=False)
    assert spark_conf()["spark.ui.enabled"] == "false"
    monkeypatch.setenv("TIDEMARK_SPARK_UI", "true")
    assert spark_conf()["spark.ui.enabled"] == "true"


def test_a_driver_maps_the_class_archive_when_setup_built_one(monkeypatch, tmp_path):
    monkeypatch.delenv(DUMP_VARIABLE, raising=False)
    archive = tmp_path / "spark-classes.jsa"
    monkeypatch.setattr(jvm_archive, "archive_path", lambda: archive)
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


def test_the_short_jobs_profile_gives_driver_and_executors_c1_and_the_serial_collector(monkeypatch):
    monkeypatch.setenv(JVM_PROFILE_VARIABLE, "short-jobs")
    conf = spark_conf()
    for side in ("driver", "executor"):
        options = conf[f"spark.{side}.extraJavaOptions"].split()
        assert {"-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"} <= set(options)
        assert "-Duser.timezone=UTC" in options


def test_the_short_jobs_profile_interprets_expressions_instead_of_compiling_them(monkeypatch):
    monkeypatch.setenv(JVM_PROFILE_VARIABLE, "short-jobs")
    assert spark_conf()["spark.sql.codegen.factoryMode"] == "NO_CODEGEN"


def test_an_unknown_jvm_profile_is_an_error_naming_the_variable_and_the_choices(monkeypatch):
    monkeypatch.setenv(JVM_PROFILE_VARIABLE, "fast")
    with pytest.raises(ValueError, match=r"TIDEMARK_JVM_PROFILE='fast'.*throughput, short-jobs"):
        spark_conf()
