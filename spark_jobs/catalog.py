"""The SQL catalog over the lakehouse: every Delta table under a layer folder
(``<lakehouse>/<layer>/<table>``: ``bronze``, ``silver``, ``quarantine``, ``gold``,
``ops``) under its layer schema, as an external Delta table at its path, whether or
not a pipeline file names it.

The SQL server registers tables in its persistent (Hive) catalog; batch jobs
such as maintenance register the same names in their in-memory catalog, so SQL
written against one runs unchanged against the other.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pyspark.sql import SparkSession

from spark_jobs.config import load_pipeline
from spark_jobs.lakehouse.files import hadoop_file
from spark_jobs.lakehouse.log import has_commits
from spark_jobs.sql import quote_identifier, string_literal
from spark_jobs.tables import LAYERS, TableRef, TableRegistry, join


class Located(Protocol):
    """A table as the catalog sees it: a layer, a name and a path."""

    @property
    def layer(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def path(self) -> str: ...


@dataclass(frozen=True)
class FoundTable:
    """A Delta table found under a layer folder of the lakehouse."""

    layer: str
    name: str
    path: str


def lakehouse_tables(spark: SparkSession, root: str) -> list[FoundTable]:
    """Every Delta table (a folder with a ``_delta_log``) one level under each layer
    folder of ``root``, through Hadoop's FileSystem (local folders and object stores
    alike). Folders whose name starts with ``_`` or ``.`` are Spark's and Delta's own."""
    found = []
    for layer in LAYERS:
        filesystem, folder = hadoop_file(spark, root, layer)
        if not filesystem.exists(folder):
            continue
        for status in filesystem.listStatus(folder):
            name = status.getPath().getName()
            if not status.isDirectory() or name.startswith(("_", ".")):
                continue
            if filesystem.exists(hadoop_file(spark, root, layer, name, "_delta_log")[1]):
                found.append(FoundTable(layer, name, join(root, layer, name)))
    return found


def qualified_name(table: Located) -> str:
    return f"{quote_identifier(table.layer)}.{quote_identifier(table.name)}"


def catalog_tables(registries: Iterable[TableRegistry]) -> list[TableRef]:
    """Every table of the registries once (the shared ops tables are in each)."""
    unique: dict[str, TableRef] = {}
    for registry in registries:
        for table in registry.all():
            unique.setdefault(table.sql_name, table)
    return list(unique.values())


def registries_for(pipeline_files: Sequence[str], lakehouse: str | None) -> list[TableRegistry]:
    return [TableRegistry(load_pipeline(path), lakehouse) for path in pipeline_files]


def register_statement(table: Located) -> str:
    return (
        f"CREATE TABLE IF NOT EXISTS {qualified_name(table)} USING delta "
        f"LOCATION {string_literal(table.path)}"
    )


def register_tables(spark: SparkSession, tables: Sequence[Located]) -> list[str]:
    """Register the tables whose Delta log holds a commit and that the catalog lacks;
    returns their names (``layer.table``). A table created later is picked up by a
    later call."""
    for layer in LAYERS:
        # Asking first: the Hive metastore logs an error for every existing schema created again.
        if not spark.catalog.databaseExists(layer):
            spark.sql(f"CREATE SCHEMA IF NOT EXISTS {quote_identifier(layer)}")
    registered = []
    for table in tables:
        known = spark.catalog.tableExists(table.name, table.layer)
        if known or not has_commits(spark, table.path):
            continue
        spark.sql(register_statement(table))
        registered.append(f"{table.layer}.{table.name}")
    return registered
