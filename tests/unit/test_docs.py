"""The documentation is true of the code (CONTRIBUTING.md, "Documentation"): its links
resolve, its runnable examples run, and its references (the CLI, the tables, the DAGs)
say what the code says. Pure and fast: no Spark starts, no Airflow is imported."""

from __future__ import annotations

import ast
import ipaddress
import os
import re
import subprocess
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml

from spark_jobs.config import PipelineConfig, load_pipeline, parse_pipeline
from spark_jobs.tables import TableRegistry, measure_fields, tuning_table
from spark_jobs.transforms.gold import count_column
from tests.tools import cli_reference

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = sorted([README, REPO / "CONTRIBUTING.md", *DOCS.rglob("*.md")])
# Where a fenced block marked runnable is run (CONTRIBUTING.md says how to mark one).
RUNNABLE_PAGES = sorted([README, *(DOCS / "guides").glob("*.md")])
RUNNABLE = ("bash", "runnable")
RUNNABLE_TIMEOUT_S = 30
README_MAX_LINES = 200
FENCE = re.compile(r"^(`{3,}|~{3,})(.*)$")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
AUTOLINK = re.compile(r"<([a-z][a-z0-9+.-]*:[^>\s]+)>", re.IGNORECASE)
REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
NUMBERED_WORK = re.compile(r"\b(session|stop|issue)s?\s+#?\d+", re.IGNORECASE)


def relative(path: Path) -> str:
    return str(path.relative_to(REPO))


def fenced_blocks(text: str) -> list[tuple[int, int, str, str]]:
    """(first line, last line, info string, body) of every fenced block; lines count from 1."""
    blocks, lines, index = [], text.split("\n"), 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence, info, start = opening.group(1), opening.group(2).strip(), index
        index += 1
        while index < len(lines) and not lines[index].startswith(fence):
            index += 1
        blocks.append((start + 1, index + 1, info, "\n".join(lines[start + 1 : index])))
        index += 1
    return blocks


def outside_fences(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced blocks."""
    fenced = {number for first, last, _, _ in fenced_blocks(text) for number in range(first, last + 1)}
    return [(n, line) for n, line in enumerate(text.split("\n"), start=1) if n not in fenced]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """Lines outside fenced blocks with inline code blanked out: what links are looked for in."""
    return [
        (n, INLINE_CODE.sub(lambda code: " " * len(code.group(0)), line)) for n, line in outside_fences(text)
    ]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found, seen = set(), {}
    for _, line in outside_fences(page.read_text()):
        heading = HEADING.match(line)
        if heading:
            base = slug(heading.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[tuple[int, str]]:
    found = []
    for number, line in prose_lines(page.read_text()):
        found += [(number, match.group(1)) for match in LINK.finditer(line)]
        found += [(number, match.group(1)) for match in AUTOLINK.finditer(line)]
        reference = REFERENCE_LINK.match(line)
        if reference:
            found.append((number, reference.group(1)))
    return found


def is_public_host(host: str | None) -> bool:
    """A host anyone can reach: a global address, or a dotted name not reserved for local use."""
    if not host or host == "localhost" or host.endswith((".localhost", ".local", ".internal")):
        return False
    try:
        return ipaddress.ip_address(host).is_global
    except ValueError:
        return "." in host


def link_problem(page: Path, target: str) -> str | None:
    """Why ``target``, linked from ``page``, is broken; None when it is fine."""
    parts = urlsplit(target)
    if parts.scheme:
        if parts.scheme != "https":
            return "an absolute link must be https"
        if not is_public_host(parts.hostname):
            return "an absolute link must name a public host"
        return None
    path = unquote(parts.path)
    resolved = (page.parent / path).resolve() if path else page
    if not resolved.is_relative_to(REPO):
        return "points outside the repository"
    if not resolved.exists():
        return f"{relative(resolved)} does not exist"
    if parts.fragment:
        if resolved.suffix != ".md":
            return "an anchor into a file that is not Markdown"
        if parts.fragment not in anchors(resolved):
            return f"no heading #{parts.fragment} in {relative(resolved)}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=relative)
def test_every_link_resolves(page):
    problems = [
        f"{relative(page)}:{number}: {target}: {problem}"
        for number, target in links(page)
        for problem in [link_problem(page, target)]
        if problem is not None
    ]
    assert not problems, "\n".join(problems)


def test_the_link_check_catches_what_it_must():
    assert link_problem(README, "docs/no-such-page.md") is not None
    assert link_problem(README, "docs/README.md#no-such-heading") is not None
    assert link_problem(README, "../shared/DESIGN.md") is not None
    assert link_problem(README, "http://example.com/") is not None
    assert link_problem(README, "https://127.0.0.1:8080/") is not None
    assert link_problem(README, "https://localhost/") is not None
    assert link_problem(README, "https://10.0.0.7/") is not None
    assert link_problem(README, "docs/README.md#concepts") is None
    assert link_problem(README, "https://github.com/delta-io/delta") is None


def runnable_blocks() -> list[tuple[str, str]]:
    return [
        (f"{relative(page)}:{line}", body)
        for page in RUNNABLE_PAGES
        for line, _, info, body in fenced_blocks(page.read_text())
        if tuple(info.split()) == RUNNABLE
    ]


def test_the_readme_quick_start_has_runnable_commands():
    quick_start = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert any(tuple(info.split()) == RUNNABLE for _, _, info, _ in fenced_blocks(quick_start))


@pytest.mark.parametrize(("where", "commands"), runnable_blocks(), ids=[w for w, _ in runnable_blocks()])
def test_runnable_commands_exit_0(where, commands, tmp_path):
    if not (REPO / ".venv" / "bin" / "tidemark").exists():
        pytest.skip("the examples use .venv/bin/tidemark: run make setup")
    environment = {**os.environ, "LAKEHOUSE_DIR": str(tmp_path / "lakehouse")}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", commands],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=RUNNABLE_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"{where} exited {done.returncode}:\n{done.stderr[-2000:]}"


def test_the_cli_reference_is_what_the_parsers_print():
    """Regenerate with: .venv/bin/python -m tests.tools.cli_reference"""
    assert cli_reference.REFERENCE.read_text() == cli_reference.render()


def test_the_readme_stays_short():
    assert len(README.read_text().splitlines()) <= README_MAX_LINES


@pytest.mark.parametrize("page", PAGES, ids=relative)
def test_no_work_session_or_issue_numbers(page):
    found = [
        f"{relative(page)}:{number}: {match.group(0)}"
        for number, line in enumerate(page.read_text().split("\n"), start=1)
        for match in NUMBERED_WORK.finditer(line)
    ]
    assert not found, "history belongs to git:\n" + "\n".join(found)


@pytest.mark.parametrize("page", sorted(DOCS.rglob("*.md")), ids=relative)
def test_every_docs_page_ends_with_see_also(page):
    lines = [line for _, line in outside_fences(page.read_text())]
    headings = [index for index, line in enumerate(lines) if HEADING.match(line)]
    last = lines[headings[-1]] if headings else ""
    assert last == "## See also", f"{relative(page)} ends with {last!r}"
    after = [line for line in lines[headings[-1] + 1 :] if line.strip()]
    assert after and all(line.startswith(("- [", "  ")) for line in after), after


@pytest.mark.parametrize("figure", sorted(DOCS.rglob("*.svg")), ids=relative)
def test_figures_are_well_formed_svg(figure):
    assert ElementTree.parse(figure).getroot().tag == "{http://www.w3.org/2000/svg}svg"


# The tables reference: every column of spark_jobs/tables.py, in order.
TABLES_PAGE = DOCS / "reference" / "tables.md"
SECTION = re.compile(r"^## `([^`]+)`$")
ROW = re.compile(r"^\| `([^`]+)` \|([^|]*)\|")
PLACEHOLDERS = {
    "<payload columns>": lambda r: [f.name for f in r.payload_fields()],
    "<bronze columns>": lambda r: [f.name for f in r.bronze_fields()],
    "<key columns>": lambda r: list(r.config.key),
    "<measure columns>": lambda r: [f.name for f in measure_fields(r.config, with_state=True)],
    "<measure results>": lambda r: [f.name for f in measure_fields(r.config, with_state=False)],
    "<group_by columns>": lambda r: list(r.config.gold.group_by),
    "<window_count or session_count>": lambda r: [count_column(r.config)],
    "<offline key columns>": lambda r: list(r.config.offline.key),
}


def documented_tables() -> dict[str, list[tuple[str, str]]]:
    """Per ``## `table` `` section, its column rows: (name or placeholder, type)."""
    tables: dict[str, list[tuple[str, str]]] = {}
    current = None
    for _, line in outside_fences(TABLES_PAGE.read_text()):
        section = SECTION.match(line)
        if section:
            current = tables.setdefault(section.group(1), [])
        elif line.startswith("## "):
            current = None
        elif current is not None and ROW.match(line):
            name, kind = ROW.match(line).groups()
            current.append((name, kind.strip()))
    return tables


# A pipeline has one of these, as its window is a session window or not.
SILVER_KINDS = {"silver.<p>_windows", "silver.<p>_sessions"}


def sessions_pipeline(path: Path) -> PipelineConfig:
    """The pipeline of ``path`` with session windows."""
    document = yaml.safe_load(path.read_text())
    document.update(window={"type": "session", "gap": "5m"})
    return parse_pipeline(document)


@pytest.mark.parametrize("pipeline", ["telemetry", "clickstream", "telemetry as sessions"])
def test_the_tables_reference_lists_every_column_in_order(pipeline, tmp_path):
    path = REPO / "spark_jobs" / "pipelines" / f"{pipeline.split()[0]}.yaml"
    config = sessions_pipeline(path) if pipeline.endswith("sessions") else load_pipeline(path)
    registry = TableRegistry(config, str(tmp_path))
    actual = {table.sql_name: table for table in [*registry.all(), tuning_table(str(tmp_path))]}
    documented = documented_tables()
    for heading, rows in documented.items():
        name = heading.replace("<p>", config.name)
        if config.gold is not None:
            name = name.replace("<gold.name>", config.gold.name)
        if name not in actual:
            assert config.gold is None or config.offline is None or heading in SILVER_KINDS, (
                f"{heading}: no such table"
            )
            continue
        fields = {field.name: field for field in actual[name].schema.fields}
        expected, types = [], {}
        for column, kind in rows:
            if column in PLACEHOLDERS:
                expected += PLACEHOLDERS[column](registry)
            else:
                expected.append(column)
                types[column] = kind
        assert expected == list(fields), f"{heading}: columns differ from spark_jobs/tables.py"
        for column, kind in types.items():
            spark_type = fields[column].dataType.simpleString().split("<")[0]
            assert kind == spark_type, f"{heading}.{column}: documented {kind}, is {spark_type}"
    named = {
        heading.replace("<p>", config.name).replace("<gold.name>", getattr(config.gold, "name", ""))
        for heading in documented
    }
    assert set(actual) <= named, f"undocumented tables: {sorted(set(actual) - named)}"


# The DAG reference: every DAG of dags/ and every one of its Params, with its default.
DAGS_PAGE = DOCS / "reference" / "dags.md"


def dags_in_code() -> dict[str, dict[str, object]]:
    """dag_id -> Param name -> its default when written as a literal ``Param(default, ...)``
    (``...`` when a helper builds it), read from dags/*.py without importing Airflow."""
    found = {}
    for path in sorted((REPO / "dags").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "dag"):
                continue
            keywords = {keyword.arg: keyword.value for keyword in node.keywords}
            params = {}
            declared = keywords.get("params")
            for key, value in zip(declared.keys, declared.values, strict=True) if declared else ():
                literal = (
                    isinstance(value, ast.Call)
                    and getattr(value.func, "id", None) == "Param"
                    and value.args
                    and isinstance(value.args[0], ast.Constant)
                )
                params[key.value] = value.args[0].value if literal else ...
            found[keywords["dag_id"].value] = params
    return found


def documented_default(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f"`{value}`" if value else ""
    return str(value)


def test_the_dag_reference_names_every_dag_and_param():
    sections: dict[str, list[list[str]]] = {}
    current = None
    for _, line in outside_fences(DAGS_PAGE.read_text()):
        section = SECTION.match(line)
        if section:
            current = sections.setdefault(section.group(1), [])
        elif line.startswith("## "):
            current = None
        elif current is not None and line.startswith("| `"):
            current.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    code = dags_in_code()
    assert set(sections) == set(code)
    for dag_id, params in code.items():
        rows = {row[0].strip("`"): row for row in sections[dag_id]}
        assert list(rows) == list(params), f"{dag_id}: Params differ from dags/"
        for name, default in params.items():
            if default is not ...:
                assert rows[name][2] == documented_default(default), f"{dag_id}.{name}: default"
