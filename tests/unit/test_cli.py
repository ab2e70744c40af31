import argparse
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from spark_jobs import sql_client
from spark_jobs.cli import main
from tests.unit.test_config import PIPELINES

TELEMETRY = str(PIPELINES / "telemetry.yaml")
# Each subcommand, and a default its help must show: one the help formatter adds
# from the option's default where the subcommand has one, else one its help writes.
SHOWN_DEFAULTS = {
    "validate": None,  # no option with a default
    "tables": "--lakehouse LAKEHOUSE lakehouse root (default: $LAKEHOUSE_DIR or ./lakehouse)",
    "run": "--interval INTERVAL micro-batch interval in continuous mode (default: 10s)",
    "bronze": "drain the backlog and exit (default: continuous)",
    "silver": "--interval INTERVAL micro-batch interval in continuous mode (default: 10s)",
    "gold": "--interval INTERVAL micro-batch interval in continuous mode (default: 10s)",
    "offline": "--interval INTERVAL micro-batch interval in continuous mode (default: 10s)",
    "replay": "--batch-size BATCH_SIZE records per micro-batch (default: 1000)",
    "merge-late": "--lakehouse LAKEHOUSE lakehouse root (default: $LAKEHOUSE_DIR or ./lakehouse)",
    "check-idle": "is stalled: exit 3 (default: 5m)",
    "maintenance": "how much history VACUUM keeps; the default is Delta's own (default: 168h)",
    "generate": "--devices DEVICES scooters in the fleet (default: 50)",
    "sql-server": "--port PORT the port to listen on (default: 10000)",
    "sql": "--format {csv,table,tsv} result format (default: table)",
}


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
    assert captured.err.startswith(f"tidemark validate: error: invalid pipeline: {bad}: pipeline: must match")
    assert "'telemetry' is valid" in captured.out


def test_tables_lists_paths_and_sql_names_without_spark(tmp_path, capsys):
    assert (
        main(["tables", "--pipeline", str(PIPELINES / "telemetry.yaml"), "--lakehouse", str(tmp_path)]) == 0
    )
    out = capsys.readouterr().out
    assert "silver.telemetry_windows" in out and f"{tmp_path}/silver/telemetry_windows" in out


def help_text(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    captured = capsys.readouterr()
    assert exit_.value.code == 0 and not captured.err, captured
    return captured.out


def examples(text: str) -> list[str]:
    """The command lines of a help's example block: its last lines, each one unwrapped."""
    lines = text.rstrip("\n").split("\n")
    block = lines[len(lines) - lines[::-1].index("example:") :]
    assert block and all(line.startswith("  tidemark") for line in block), block
    return [line.strip() for line in block]


def test_the_commands_help_ends_with_examples(capsys):
    text = help_text([], capsys)
    assert [command.split()[1] for command in examples(text)] == ["validate", "generate", "run"]


@pytest.mark.parametrize("command", SHOWN_DEFAULTS)
def test_every_subcommand_help_ends_with_examples_and_shows_defaults(command, capsys):
    text = help_text([command], capsys)
    assert text.startswith(f"usage: tidemark {command} ")
    assert all(line.split()[1] == command for line in examples(text))
    flat = " ".join(text.split())
    if SHOWN_DEFAULTS[command] is not None:
        assert SHOWN_DEFAULTS[command] in flat
    assert "(default: None)" not in flat and "(default: False)" not in flat
    assert flat.count("(default 10s)") == flat.count("(default 1000)") == 0  # no hand-written duplicates


class Parsed(Exception):
    """Raised instead of running a command whose arguments parsed."""


@pytest.mark.parametrize("command", [None, *SHOWN_DEFAULTS])
def test_every_example_parses(command, capsys, monkeypatch):
    """The examples use the real flags and choices: each parses with the parser of its
    subcommand (whichever module owns it), and nothing runs."""
    text = help_text([command] if command else [], capsys)
    parse_args = argparse.ArgumentParser.parse_args

    def parse_then_stop(parser, args=None, namespace=None):
        raise Parsed(parser.prog, parse_args(parser, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    for example in examples(text):
        argv = shlex.split(example)[1:]
        with pytest.raises(Parsed) as parsed:
            main(argv)
        prog, namespace = parsed.value.args
        assert prog == f"tidemark {argv[0]}" or namespace.command == argv[0], example
    assert capsys.readouterr().err == ""


def last_error(capsys: pytest.CaptureFixture[str]) -> str:
    """What the command printed on stderr, which must hold no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_a_failure_while_running_exits_1_in_the_same_form(tmp_path, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a lakehouse\n")
    argv = [
        "generate",
        "--pipeline",
        TELEMETRY,
        "--lakehouse",
        str(a_file),
        "--devices",
        "1",
        "--duration",
        "1m",
    ]
    assert main(argv) == 1
    err = last_error(capsys)
    assert err.startswith("tidemark generate: error: ") and "Not a directory" in err and err.count("\n") == 1


def test_a_failed_query_exits_1_in_the_same_form(capsys, monkeypatch):
    monkeypatch.setattr(sql_client, "run_query", lambda *args: (1, "", "cannot reach the SQL server"))
    assert main(["sql", "SELECT 1"]) == 1
    assert last_error(capsys) == "tidemark sql: error: cannot reach the SQL server\n"
