import subprocess
import sys
from pathlib import Path

from spark_jobs.cli import main
from tests.unit.test_config import PIPELINES


def test_the_installed_tidemark_command_prints_help():
    tidemark = Path(sys.executable).with_name("tidemark")
    done = subprocess.run([str(tidemark), "--help"], capture_output=True, text=True, check=True)
    assert "usage: tidemark" in done.stdout and "validate" in done.stdout


def test_validate_accepts_the_shipped_pipelines(capsys):
    assert main(["validate", *map(str, sorted(PIPELINES.glob("*.yaml")))]) == 0
    assert "pipeline 'telemetry' is valid" in capsys.readouterr().out


def test_validate_reports_each_bad_file_and_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipeline: Bad-Name\n")
    assert main(["validate", str(bad), str(PIPELINES / "telemetry.yaml")]) == 2
    captured = capsys.readouterr()
    assert "bad.yaml: pipeline: must match" in captured.err
    assert "'telemetry' is valid" in captured.out


def test_tables_lists_paths_and_sql_names_without_spark(tmp_path, capsys):
    assert (
        main(["tables", "--pipeline", str(PIPELINES / "telemetry.yaml"), "--lakehouse", str(tmp_path)]) == 0
    )
    out = capsys.readouterr().out
    assert "silver.telemetry_windows" in out and f"{tmp_path}/silver/telemetry_windows" in out
