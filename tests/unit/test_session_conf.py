"""The session factory's settings (what spark-submit passes as --conf too)."""

from __future__ import annotations

from spark_jobs import jvm_archive
from spark_jobs.jvm_archive import DUMP_VARIABLE
from spark_jobs.session import spark_conf


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
