"""The session factory's settings (what spark-submit passes as --conf too)."""

from __future__ import annotations

from spark_jobs.session import spark_conf


def test_jobs_start_without_the_spark_ui_unless_asked_for_it(monkeypatch):
    monkeypatch.delenv("TIDEMARK_SPARK_UI", raising=False)
    assert spark_conf()["spark.ui.enabled"] == "false"
    monkeypatch.setenv("TIDEMARK_SPARK_UI", "true")
    assert spark_conf()["spark.ui.enabled"] == "true"
