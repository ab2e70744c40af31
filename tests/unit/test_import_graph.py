"""The code's dependencies point one way, read from its import statements (every
import, a function's own included): cli -> jobs -> engine -> {lakehouse, transforms,
sources, eventtime}; nothing but the command line imports a job; the event-time rules
import no Spark; only the storage layer reaches into Delta's JVM classes."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "spark_jobs"
# The command line, and the setup tool that replays a pipeline to record the JVM's classes.
TOP = {"spark_jobs.cli", "spark_jobs.jvm_archive"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def imports() -> dict[str, set[str]]:
    """Module -> every module it imports (``from a.b import c`` counts ``a.b`` and, when
    it is a module, ``a.b.c``)."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found |= {
                    f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules
                }
        graph[name] = found
    return graph


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def reachable(start: str) -> set[str]:
    """Every module ``start`` imports, directly or through the package's own modules."""
    graph, seen, todo = imports(), set(), [start]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def importers(package: str) -> set[str]:
    return {
        module
        for module, targets in imports().items()
        if not within(module, package) and any(within(target, package) for target in targets)
    }


def test_the_graph_is_read_from_the_code():
    graph = imports()
    assert "spark_jobs.engine.late_merge" in graph["spark_jobs.jobs.merge_late"]
    assert "pyspark.sql" in graph["spark_jobs.lakehouse.transaction"]


def test_only_the_command_line_imports_the_jobs():
    assert importers("spark_jobs.jobs") <= TOP


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("spark_jobs.engine", ("spark_jobs.jobs", "spark_jobs.cli")),
        ("spark_jobs.lakehouse", ("spark_jobs.jobs", "spark_jobs.engine", "spark_jobs.transforms")),
        ("spark_jobs.transforms", ("spark_jobs.jobs", "spark_jobs.engine", "spark_jobs.lakehouse")),
        ("spark_jobs.sources", ("spark_jobs.jobs", "spark_jobs.engine")),
        ("spark_jobs.eventtime", ("spark_jobs.jobs", "spark_jobs.engine", "spark_jobs.lakehouse")),
    ],
)
def test_a_layer_imports_nothing_above_it(package, forbidden):
    for module, targets in imports().items():
        if within(module, package):
            assert not [t for t in targets if any(within(t, above) for above in forbidden)], module


def test_the_event_time_rules_import_no_spark_even_through_other_modules():
    for module in imports():
        if within(module, "spark_jobs.eventtime"):
            spark = {
                target for target in reachable(module) if within(target, "pyspark") or within(target, "py4j")
            }
            assert spark == set(), module


def test_only_the_storage_layer_names_deltas_jvm_classes():
    naming = {
        module_name(path)
        for path in PACKAGE.rglob("*.py")
        if "org.apache.spark.sql.delta."
        in path.read_text().replace('"org.apache.spark.sql.delta.catalog', "")
    }
    assert naming and all(within(module, "spark_jobs.lakehouse") for module in naming), naming
