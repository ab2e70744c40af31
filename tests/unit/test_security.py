"""Nobody let in: names from pipeline files cannot become SQL, SQL text quotes what it
interpolates, no credentials are committed, and the Airflow we start always asks
for a login (its REST API refusing anonymous callers is tested against a real
standalone in tests/integration/test_airflow_ui.py)."""

from __future__ import annotations

import ast
import copy
import math
import re
import subprocess
from pathlib import Path

import pytest
from tidemark_airflow.standalone import PASSWORDS_FILE, SIMPLE_AUTH_MANAGER, USER, environment

from spark_jobs.config import ConfigError, parse_pipeline
from spark_jobs.engine.detector import sql_literal
from spark_jobs.sql import null_safe_match
from tests.unit.test_config import telemetry

REPO = Path(__file__).resolve().parents[2]

# ---- 1. identifiers: validated by config.py, quoted wherever SQL text is built

HOSTILE_NAMES = [
    "x; DROP TABLE bronze.telemetry",
    "a`b",
    "a b",
    "a.b",
    "x' OR '1'='1",
    "a--",
    "é",
    "",
    "1a",
]
# Where a pipeline file names a table or a column, and a valid name for that place
# (the valid name plus a newline checks names are matched whole, not up to `$`).
PLACES = {
    "pipeline": ("pipeline", "telemetry"),
    "gold.name": ("gold.name", "region_hourly"),
    "schema column": ("schema.{}", "altitude"),
    "partition_column": ("partition_column", "partition"),
    "key": ("key", "region"),
    "measure column": ("measures.{}", "speed"),
    "measure function": ("measures.speed", "max"),
    "gold.group_by": ("gold.group_by", "region"),
    "offline.key": ("offline.key", "device_id"),
    "event_time.column": ("event_time.column", "ts"),
}


def placed(document: dict, place: str, name: str) -> dict:
    path, _ = PLACES[place]
    document = copy.deepcopy(document)
    *parents, last = path.format(name).split(".", 1) if "{}" in path else path.split(".")
    section = document
    for part in parents:
        section = section[part]
    listed = place in ("key", "gold.group_by", "offline.key", "measure function")
    section[last] = [name] if listed else ("double" if place == "schema column" else name)
    if place == "measure column":
        section[last] = ["max"]
        document["schema"][name] = "double"
    return document


@pytest.mark.parametrize("place", PLACES)
def test_the_valid_name_of_each_place_is_accepted(place):
    """The control: each place takes a plain name, so the refusals below are about the names."""
    parse_pipeline(placed(telemetry(), place, PLACES[place][1]))


@pytest.mark.parametrize("name", [*HOSTILE_NAMES, "trailing-newline"])
@pytest.mark.parametrize("place", PLACES)
def test_names_that_could_carry_sql_are_refused_wherever_a_pipeline_file_puts_them(place, name):
    if name == "trailing-newline":
        name = PLACES[place][1] + "\n"
    with pytest.raises(ConfigError):
        parse_pipeline(placed(telemetry(), place, name))


@pytest.mark.spark
def test_a_merge_condition_keeps_any_column_name_a_name(spark):
    """Quoting, not only validation: a name with backticks and SQL in it still
    matches itself and nothing else."""
    name = "k`) OR (1=1 --"
    target = spark.createDataFrame([("a", 1), ("b", 2)], ["k", "v"]).toDF(name, "v").alias("t")
    source = spark.createDataFrame([("a", 10)], ["k", "v"]).toDF(name, "v").alias("s")
    assert target.join(source, null_safe_match([name])).count() == 1


@pytest.mark.spark
@pytest.mark.parametrize(
    "value", ["O'Brien", "back\\slash\\", "'; DROP TABLE t; --", "\u2028\n", "", 3, -2.5, None, True]
)
def test_key_values_become_sql_literals_that_read_back_as_themselves(spark, value):
    assert spark.sql(f"SELECT {sql_literal(value)} AS v").first().v == value


@pytest.mark.spark
def test_a_nan_key_value_is_a_literal_not_a_column_name(spark):
    assert math.isnan(spark.sql(f"SELECT {sql_literal(float('nan'))} AS v").first().v)


# Every f-string that builds SQL text must interpolate only values a quoting helper made.
QUOTING_HELPERS = {
    "quote_identifier",
    "string_literal",
    "qualified_name",
    "sql_literal",
    "_sql_string",
    "is_in_sql",
    "timestamp_literal",
}
SQL_WORDS = re.compile(
    r"<=>|\b(AND|OR|NOT|SELECT|FROM|WHERE|CREATE|DROP|LOCATION|OPTIMIZE|VACUUM|CAST|NULL)\b"
)
SPARK_TEXT_CALLS = {"col", "expr", "sql", "selectExpr", "where", "filter", "merge"}
# (file, interpolated expression): why it is safe.
SQL_ALLOWED = {
    ("spark_jobs/jobs/maintenance.py", "name"): "name = qualified_name(table), quoted",
    ("spark_jobs/engine/late_merge.py", "run_id"): "an error message that mentions NULL, not SQL",
    ("spark_jobs/engine/claims.py", "in_range"): "SQL text of TimeRange.sql: timestamp_literal values",
}


def unquoted_sql_values(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.JoinedStr):
            continue
        parent = parents.get(node)
        called = getattr(
            getattr(parent, "func", None), "attr", getattr(getattr(parent, "func", None), "id", "")
        )
        texts = [part.value for part in node.values if isinstance(part, ast.Constant)]
        if called not in SPARK_TEXT_CALLS and not any(SQL_WORDS.search(text) for text in texts):
            continue
        for index, part in enumerate(node.values):
            if not isinstance(part, ast.FormattedValue):
                continue
            value = part.value
            following = node.values[index + 1] if index + 1 < len(node.values) else None
            helper = getattr(
                getattr(value, "func", None), "id", getattr(getattr(value, "func", None), "attr", None)
            )
            safe = (
                helper in QUOTING_HELPERS
                or (isinstance(value, ast.Name) and value.id.isupper())  # a module constant
                or part.format_spec is not None  # a number formatted as such
                # a table alias the code chose: `{alias}.{quote_identifier(name)}`
                or (isinstance(following, ast.Constant) and str(following.value).startswith("."))
                or (str(path.relative_to(REPO)), ast.unparse(value)) in SQL_ALLOWED
            )
            if not safe:
                found.append(
                    f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(value)} in {ast.unparse(node)}"
                )
    return found


def test_sql_text_interpolates_only_quoted_names_and_literals():
    sources = [*REPO.glob("spark_jobs/**/*.py"), *REPO.glob("plugins/**/*.py"), *REPO.glob("dags/*.py")]
    assert len(sources) > 30
    assert [problem for path in sorted(sources) for problem in unquoted_sql_values(path)] == []


def test_the_sql_scan_finds_an_unquoted_name(tmp_path, monkeypatch):
    """The scan's control: the condition offline detection used to build is flagged."""
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    (tmp_path / "old.py").write_text('condition = " AND ".join(f"t.{c} <=> s.{c}" for c in key)\n')
    assert len(unquoted_sql_values(tmp_path / "old.py")) == 2


# ---- 2. no credentials in tracked files

SECRETS = {
    "private key": re.compile(r"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----"),
    "AWS access key id": re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    "GitHub token": re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b"),
    "Slack token": re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
    "API key": re.compile(r"\bsk-[A-Za-z0-9_-]{20,}"),
    "Google API key": re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b"),
    "JWT": re.compile(r"\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"),
    "credentials in a URL": re.compile(r"\b[a-z][a-z0-9+.-]*://[^/\s:@$]+:[^/\s@$]+@"),
    "secret in code": re.compile(
        r"(?i)\b\w*(?:password|passwd|secret|token|api_?key)\s*[:=]\s*[rbf]?([\"'])(?P<value>[^\"'\s]{6,})\1"
    ),
}
SECRET_IN_CONFIG = re.compile(
    r"(?i)^\s*[\w.-]*(?:password|passwd|secret|token|api_?key)\s*[:=]\s*[\"']?(?P<value>[^\s\"'#]+)"
)
CONFIG_FILES = re.compile(r"(\.env|\.example|\.ya?ml|\.cfg|\.ini|\.properties|\.conf|\.toml|\.json)$")
# Values that say "put yours here" rather than being one.
PLACEHOLDER = re.compile(r"^(\$\{.*|<.*>|change-?me|example|\*+|x+|none|null|false|true)$", re.IGNORECASE)
# (file, matched text): why it is not a credential.
SECRETS_ALLOWED: dict[tuple[str, str], str] = {}


def secrets_in(name: str, text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        hits = [(kind, match) for kind, pattern in SECRETS.items() for match in pattern.finditer(line)]
        if CONFIG_FILES.search(name) or "docker-compose" in name:
            hits += [("secret in config", match) for match in [SECRET_IN_CONFIG.match(line)] if match]
        for kind, match in hits:
            value = match.groupdict().get("value")
            if (value is not None and PLACEHOLDER.match(value)) or (name, match.group(0)) in SECRETS_ALLOWED:
                continue
            found.append(f"{name}:{number}: {kind}")
    return found


def test_no_tracked_file_holds_a_credential():
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True)
    names = [name for name in listed.stdout.split("\0") if name]
    assert len(names) > 50
    found = []
    for name in names:
        try:
            text = (REPO / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):  # binary, or deleted in the working tree
            continue
        found += secrets_in(name, text)
    assert found == []


@pytest.mark.parametrize(
    ("name", "line"),
    [
        ("key.pem", "-----BEGIN " + "RSA PRIVATE KEY-----"),
        ("a.py", "aws = 'AKIA" + "ABCDEFGHIJKLMNOP'"),
        ("a.py", 'db_password = "' + 'hunter2hunter2"'),
        ("a.py", "url = 'postgresql://tidemark:" + "s3cret@db:5432/x'"),
        (".env", "AIRFLOW_JWT_SECRET=" + "9f8e7d6c5b4a"),
        ("docker-compose.yml", "      POSTGRES_PASSWORD: " + "hunter2hunter2"),
        ("a.py", "token = 'ghp_" + "a" * 36 + "'"),
    ],
)
def test_the_credential_scan_finds_planted_secrets(name, line):
    assert secrets_in(name, line), line


def test_the_credential_scan_lets_placeholders_through():
    lines = [
        "POSTGRES_PASSWORD=change-me",
        "      AIRFLOW__API_AUTH__JWT_SECRET: ${AIRFLOW_JWT_SECRET:?set it}",
    ]
    assert secrets_in("tidemark.env.example", "\n".join(lines)) == []


# ---- 3. the Airflow we start asks for a login, whatever the environment says


def test_standalone_always_runs_the_simple_auth_manager_with_a_login(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "True")
    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER", "somewhere.else.NoAuthManager")
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", "/tmp/known-passwords.json")
    monkeypatch.setenv("AIRFLOW__API__HOST", "0.0.0.0")
    settings = environment(tmp_path / "home", tmp_path / "lakehouse", 8080)
    assert settings["AIRFLOW__CORE__AUTH_MANAGER"] == SIMPLE_AUTH_MANAGER
    assert settings["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] == "False"
    assert settings["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == f"{USER}:admin"
    assert settings["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] == str(
        tmp_path / "home" / PASSWORDS_FILE
    )
    assert settings["AIRFLOW__API__HOST"] == "127.0.0.1"  # loopback only


def test_standalone_settings_cannot_switch_the_login_off_either(tmp_path):
    settings = environment(
        tmp_path / "home",
        tmp_path / "lakehouse",
        8080,
        settings={
            "AIRFLOW__CORE__AUTH_MANAGER": "somewhere.else.NoAuthManager",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__API__HOST": "0.0.0.0",
            "TIDEMARK_PIPELINES": "/srv/pipelines",
        },
    )
    assert settings["AIRFLOW__CORE__AUTH_MANAGER"] == SIMPLE_AUTH_MANAGER
    assert settings["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] == "False"
    assert settings["AIRFLOW__API__HOST"] == "127.0.0.1"
    assert settings["TIDEMARK_PIPELINES"] == "/srv/pipelines"  # other settings do pass
