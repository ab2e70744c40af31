"""Bad command lines for every job, through the ``tidemark`` dispatch: exit code 2,
the culprit named on stderr in the one form every command uses
(``tidemark <command>: error: <message>``), and refused before Spark starts, so
nothing is written (every ``build_session`` the jobs call is replaced by one that fails the test)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from spark_jobs import session
from spark_jobs.cli import main as tidemark
from spark_jobs.jobs import check_idle, common, maintenance, merge_late
from tests.unit.test_config import PIPELINES

TELEMETRY = str(PIPELINES / "telemetry.yaml")
CLICKSTREAM = str(PIPELINES / "clickstream.yaml")  # Kafka: no partition_column
STREAMS = ("bronze", "silver", "gold", "offline")
# Where the jobs build their sessions (the streams through common.stream_session, a
# replay through session.session_for_records).
SESSION_BUILDERS = (common, session, merge_late, check_idle, maintenance)
RECORD = '{"device_id": "d1", "ts": 1767225600000, "region": "north", "partition": 1}\n'


@pytest.fixture(autouse=True)
def sandbox(tmp_path, monkeypatch) -> Path:
    """A working folder that is also $LAKEHOUSE_DIR's parent, and no Spark."""

    def no_spark(*args: object, **kwargs: object) -> None:
        raise AssertionError("the job started Spark before it refused its arguments")

    for module in SESSION_BUILDERS:
        monkeypatch.setattr(module, "build_session", no_spark)
    monkeypatch.setenv("LAKEHOUSE_DIR", str(tmp_path / "lakehouse"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("not a folder\n")
    (tmp_path / "in.json").write_text(RECORD)
    (tmp_path / "latin1.json").write_bytes(b'{"device_id": "caf\xe9"}\n')
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "in.csv").write_text("device_id,ts,region,battery,speed,partition\nd1,1,north,1.0,2.0,1\n")
    document = yaml.safe_load(Path(TELEMETRY).read_text())
    document["source"]["format"] = "csv"
    (tmp_path / "csv.yaml").write_text(yaml.safe_dump(document))
    (tmp_path / "broken.yaml").write_text("pipeline: telemetry\nschema: [\n")
    (tmp_path / "bad-name.yaml").write_text("pipeline: Bad-Name\n")
    return tmp_path


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(argv: list[str], capsys: pytest.CaptureFixture[str], sandbox: Path) -> str:
    """Run ``tidemark <argv>``; it must exit 2, write nothing and say why in one
    message of the one form, after argparse's usage line when argparse refused it,
    with no traceback. Returns its stderr."""
    before = files_under(sandbox)
    try:
        code = tidemark(argv)
    except SystemExit as exit_:  # argparse's own refusals
        code = exit_.code
    captured = capsys.readouterr()
    assert code == 2, captured
    assert files_under(sandbox) == before, "a refused job wrote files"
    assert not (sandbox / "lakehouse").exists()
    err = captured.err
    form = f"tidemark {argv[0]}: error: "
    if err.startswith("usage: "):
        assert err.startswith(f"usage: tidemark {argv[0]} ") and f"\n{form}" in err, err
    else:
        assert err.startswith(form), err
    assert err.count(": error: ") == 1 and "Traceback" not in err, err
    return err


STREAM_CASES = [
    ([], "--pipeline"),
    (["--pipeline", "nowhere.yaml"], "nowhere.yaml"),
    (["--pipeline", "broken.yaml"], "invalid pipeline"),
    (["--pipeline", TELEMETRY, "--trigger", "once"], "--trigger"),
    (["--pipeline", TELEMETRY, "--interval", "0s"], "--interval"),
    (["--pipeline", TELEMETRY, "--interval", "-5s"], "--interval"),
    (["--pipeline", TELEMETRY, "--interval", "10"], "--interval"),
    (["--pipeline", TELEMETRY, "--bogus"], "--bogus"),
    (["--pipeline", TELEMETRY, "--lakehouse", "a-file"], "--lakehouse"),
    (["--pipeline", TELEMETRY, "--checkpoint", "a-file"], "--checkpoint"),
]


@pytest.mark.parametrize("job", STREAMS)
@pytest.mark.parametrize(("argv", "named"), STREAM_CASES, ids=[" ".join(c[0][-2:]) for c in STREAM_CASES])
def test_stream_jobs_refuse_bad_arguments(job, argv, named, capsys, sandbox):
    assert named in refused([job, *argv], capsys, sandbox)


OTHER_CASES = [
    (["silver", "--pipeline", TELEMETRY, "--flush"], "--flush"),  # a continuous stream has no end
    (["replay", "--pipeline", TELEMETRY], "--input"),
    (["replay", "--pipeline", TELEMETRY, "--input", "nowhere.json"], "--input"),
    (["replay", "--pipeline", TELEMETRY, "--input", "."], "--input"),
    (["replay", "--pipeline", TELEMETRY, "--input", "latin1.json"], "--input"),
    (["replay", "--pipeline", TELEMETRY, "--input", "in.json", "--batch-size", "0"], "--batch-size"),
    (["replay", "--pipeline", TELEMETRY, "--input", "in.json", "--batch-size", "-5"], "--batch-size"),
    (["replay", "--pipeline", TELEMETRY, "--input", "in.json", "--batch-size", "ten"], "--batch-size"),
    (["replay", "--pipeline", TELEMETRY, "--input", "in.json", "--batch-column", "nope"], "--batch-column"),
    (
        [
            "replay",
            "--pipeline",
            TELEMETRY,
            "--input",
            "in.json",
            "--batch-size",
            "5",
            "--batch-column",
            "ts",
        ],
        "not allowed with",
    ),
    (["replay", "--pipeline", "csv.yaml", "--input", "empty.csv"], "--input"),
    (["replay", "--pipeline", "csv.yaml", "--input", "in.csv", "--batch-column", "nope"], "--batch-column"),
    (["replay", "--pipeline", CLICKSTREAM, "--input", "in.json"], "partition_column"),
    (["replay", "--pipeline", TELEMETRY, "--input", "in.json", "--lakehouse", "a-file"], "--lakehouse"),
    (["merge-late", "--pipeline", TELEMETRY, "--from", "yesterday"], "--from"),
    (["merge-late", "--pipeline", TELEMETRY, "--to", "2026-02-30T00:00:00Z"], "--to"),
    (
        ["merge-late", "--pipeline", TELEMETRY, "--from", "2026-01-02T00:00:00Z", "--to", "2026-01-01"],
        "--to",
    ),
    (["merge-late", "--pipeline", TELEMETRY, "--from", "2026-01-01", "--to", "2026-01-01"], "--to"),
    (["merge-late", "--pipeline", TELEMETRY, "--lakehouse", "typo"], "--lakehouse"),
    (["merge-late", "--pipeline", "broken.yaml", "--dry-run"], "invalid pipeline"),
    (["check-idle", "--pipeline", TELEMETRY, "--stall-after", "0m"], "--stall-after"),
    (["check-idle", "--pipeline", TELEMETRY, "--stall-after", "soon"], "--stall-after"),
    (["check-idle", "--pipeline", TELEMETRY, "--lakehouse", "a-file"], "--lakehouse"),
    (["maintenance", "--pipeline", TELEMETRY, "--retain", "0h"], "--retain"),
    (["maintenance"], "--pipeline"),
]


@pytest.mark.parametrize(
    ("argv", "named"), OTHER_CASES, ids=[" ".join(c[0][:1] + c[0][3:]) for c in OTHER_CASES]
)
def test_batch_jobs_and_replay_refuse_bad_arguments(argv, named, capsys, sandbox):
    assert named in refused(argv, capsys, sandbox)


def test_the_message_says_which_argument_and_why(capsys, sandbox):
    err = refused(["replay", "--pipeline", TELEMETRY, "--input", "nowhere.json"], capsys, sandbox)
    assert err == "tidemark replay: error: --input: cannot read nowhere.json: No such file or directory\n"


UNKNOWN = "--pipeline: no file 'nosuch' and no configured pipeline of that name"
MISSING = "invalid pipeline: <file>: cannot read nowhere.yaml: No such file or directory"
ONE_FORM = [
    # a bad duration
    (
        ["generate", "--pipeline", TELEMETRY, "--duration", "10"],
        "--duration: expected a duration such as 500ms",
    ),
    (["bronze", "--pipeline", TELEMETRY, "--interval", "0s"], "--interval: must be positive; got '0s'"),
    (["maintenance", "--pipeline", TELEMETRY, "--retain", "1 week"], "--retain: expected a duration such as"),
    # an unknown pipeline name
    (["tables", "--pipeline", "nosuch"], UNKNOWN),
    (["check-idle", "--pipeline", "nosuch"], UNKNOWN),
    (["validate", "nosuch"], UNKNOWN),
    # a pipeline file that does not exist
    (["generate", "--pipeline", "nowhere.yaml"], MISSING),
    (["merge-late", "--pipeline", "nowhere.yaml"], MISSING),
    (["validate", "nowhere.yaml"], MISSING),
    # an invalid pipeline file
    (["tables", "--pipeline", "bad-name.yaml"], "invalid pipeline: bad-name.yaml: pipeline: must match"),
    (["offline", "--pipeline", "bad-name.yaml"], "invalid pipeline: bad-name.yaml: pipeline: must match"),
    (["validate", "broken.yaml"], "invalid pipeline: broken.yaml: <file>: not valid YAML"),
    (["gold", "--pipeline", "broken.yaml"], "invalid pipeline: broken.yaml: <file>: not valid YAML"),
    # arguments that parse but do not fit together
    (
        ["generate", "--pipeline", TELEMETRY, "--partitions", "2", "--quiet-partitions", "2"],
        "--quiet-partitions: must leave a partition sending: below --partitions (2); got 2",
    ),
    (["run", "--pipeline", TELEMETRY, "--flush"], "--flush: needs --trigger available-now"),
]


@pytest.mark.parametrize(
    ("argv", "message"), ONE_FORM, ids=[" ".join(a for a in c[0] if a != TELEMETRY) for c in ONE_FORM]
)
def test_bad_input_is_reported_in_one_form(argv, message, capsys, sandbox, monkeypatch):
    monkeypatch.delenv("TIDEMARK_PIPELINES", raising=False)
    assert refused(argv, capsys, sandbox).startswith(f"tidemark {argv[0]}: error: {message}")


USAGE_ERRORS = [
    (["sql", "--port", "0"], "argument --port: expected a TCP port between 1 and 65535; got '0'"),
    (["sql-server", "--port", "x"], "argument --port: expected a TCP port between 1 and 65535; got 'x'"),
    (["replay", "--pipeline", TELEMETRY], "the following arguments are required: --input"),
    (["tables"], "the following arguments are required: --pipeline"),
    (["check-idle", "--pipeline", TELEMETRY, "--bogus"], "unrecognized arguments: --bogus"),
]


@pytest.mark.parametrize(("argv", "message"), USAGE_ERRORS, ids=[c[0][0] for c in USAGE_ERRORS])
def test_argparse_refusals_keep_the_usage_line_and_take_the_same_form(argv, message, capsys, sandbox):
    usage, *_, error = refused(argv, capsys, sandbox).rstrip("\n").split("\n")
    assert usage.startswith(f"usage: tidemark {argv[0]} ")
    assert error == f"tidemark {argv[0]}: error: {message}"


def test_a_merge_before_any_quarantine_exists_has_nothing_to_do(capsys, sandbox):
    """The hourly merge may come before silver ever ran: no Spark, no tables, exit 0."""
    (sandbox / "lakehouse").mkdir()
    assert tidemark(["merge-late", "--pipeline", TELEMETRY]) == 0
    assert "nothing to merge" in capsys.readouterr().out
    assert list((sandbox / "lakehouse").iterdir()) == []


@pytest.mark.parametrize(
    ("argument", "value", "expected"),
    [
        ("--devices", "0", "above 0"),
        ("--partitions", "-2", "above 0"),
        ("--records-per-file", "many", "above 0"),
        ("--quiet-partitions", "-1", "0 or more"),
        ("--late-ratio", "1.5", "between 0 and 1"),
        ("--malformed-ratio", "nan", "between 0 and 1"),
        ("--rate", "inf", "finite number above 0"),
    ],
)
def test_the_generator_refuses_counts_and_shares_out_of_range(argument, value, expected, capsys, sandbox):
    stderr = refused(["generate", "--pipeline", TELEMETRY, argument, value], capsys, sandbox)
    assert f"argument {argument}: expected a" in stderr and expected in stderr
