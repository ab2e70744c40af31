"""Gold and offline detection are optional pipeline sections: without one the job
succeeds with nothing to do, and the pipeline's application runs no such query."""

from __future__ import annotations

import pytest

from spark_jobs.config import load_pipeline
from spark_jobs.jobs import gold, offline
from spark_jobs.jobs.common import JobContext
from spark_jobs.tables import TableRegistry
from tests.unit.test_config import PIPELINES


@pytest.mark.parametrize(("job", "module"), [("gold", gold), ("offline", offline)])
def test_a_job_whose_section_is_absent_succeeds_without_spark(job, module, tmp_path, capsys):
    registry = TableRegistry(load_pipeline(PIPELINES / "clickstream.yaml"), str(tmp_path))
    context = JobContext(job, registry.config, registry, "available-now", 1_000, str(tmp_path / job))
    assert module.stream(None, context) is None
    assert module.run(None, context) == 0
    assert f"pipeline 'clickstream' has no {job} section; nothing to do" in capsys.readouterr().out
