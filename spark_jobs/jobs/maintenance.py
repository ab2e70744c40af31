"""``tidemark maintenance``: OPTIMIZE and VACUUM every Delta table of a pipeline
(and the shared ops tables), and report the streaming checkpoints' sizes.

The SQL names the tables the way the SQL server's catalog does (``silver.<p>_windows``):
the job registers them in its own session catalog first, so these statements
run unchanged in ``tidemark sql``.

OPTIMIZE commits carry ``dataChange = false``, so the change-feed readers (silver
reads bronze, gold reads silver) skip them; conflicts with the running streams'
MERGEs are retried. VACUUM keeps ``--retain`` of history (7 days by default),
which must exceed the longest a stream or a time-travel query may lag behind.
A table created within that retention is not vacuumed: every file in it was
written after its first commit, so none is old enough to delete, and a VACUUM
would only list the whole table.
Streaming checkpoints clean themselves (Spark keeps the last 100 batches); this
job only reports their sizes so growth shows up in the task log. Landed files a
pipeline archives are deleted once older than its ``source.archive_retention``.
"""

from __future__ import annotations

import argparse
import sys
import time

from pyspark.sql import SparkSession

from spark_jobs.arguments import with_examples
from spark_jobs.catalog import qualified_name, register_tables
from spark_jobs.config import PIPELINE_HELP, load_pipeline, parse_duration
from spark_jobs.faults import crash_point
from spark_jobs.jobs.common import exit_with_named_errors
from spark_jobs.lakehouse.files import delete_older_than, subfolder_sizes
from spark_jobs.lakehouse.log import created_ms
from spark_jobs.lakehouse.runs import RunLog, RunTotals
from spark_jobs.lakehouse.transaction import retry_on_conflict
from spark_jobs.session import build_session
from spark_jobs.tables import TableRef, TableRegistry, join

HOUR_MS = 3_600_000


def may_hold_files_to_vacuum(created: int | None, now_ms: int, retain_ms: int) -> bool:
    """Whether VACUUM may find a file to delete, one last modified more than the
    retention ago, in a table whose first commit was written at ``created`` (None: so
    long ago that the log no longer holds it)."""
    return created is None or now_ms - created > retain_ms


def maintain(spark: SparkSession, table: TableRef, retain_ms: int) -> str:
    if not spark.catalog.tableExists(table.name, table.layer):
        return f"{table.sql_name}: not created yet"
    name = qualified_name(table)
    compacted = retry_on_conflict(lambda: spark.sql(f"OPTIMIZE {name}").first(), f"OPTIMIZE {name}")
    crash_point("maintenance:optimize")
    metrics = compacted.metrics
    retain_hours = retain_ms / HOUR_MS
    if may_hold_files_to_vacuum(created_ms(spark, table.path), int(time.time() * 1000), retain_ms):
        spark.sql(f"VACUUM {name} RETAIN {retain_hours:g} HOURS").collect()
        vacuumed = f"vacuumed (retaining {retain_hours:g} h)"
    else:
        vacuumed = f"not vacuumed: created within the {retain_hours:g} h retention"
    compaction = f"{metrics.numFilesRemoved} files compacted into {metrics.numFilesAdded}"
    return f"{table.sql_name}: {compaction}; {vacuumed}"


def checkpoint_report(spark: SparkSession, registry: TableRegistry) -> list[str]:
    sizes = subfolder_sizes(spark, join(registry.root, "_checkpoints", registry.config.name))
    return [f"checkpoint {name}: {size / 1e6:.1f} MB" for name, size in sorted(sizes.items())]


def archive_expiry(spark: SparkSession, registry: TableRegistry) -> list[str]:
    """Archived landing files older than the pipeline's ``archive_retention``, deleted."""
    source = registry.config.source
    if source.landed_files != "archive" or source.archive_retention_ms is None:
        return []
    cutoff = int(time.time() * 1000) - source.archive_retention_ms
    deleted = delete_older_than(spark, registry.archive_path, cutoff)
    return [f"archive {registry.archive_path}: {deleted} landed files past their retention deleted"]


@exit_with_named_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tidemark maintenance",
        description="OPTIMIZE and VACUUM every Delta table of a pipeline, report its checkpoints' sizes.",
    )
    with_examples(
        parser,
        "tidemark maintenance --pipeline telemetry",
        "tidemark maintenance --pipeline telemetry --retain 336h",
    )
    parser.add_argument("--pipeline", required=True, help=PIPELINE_HELP)
    parser.add_argument("--lakehouse", help="lakehouse root (default: $LAKEHOUSE_DIR or ./lakehouse)")
    parser.add_argument(
        "--retain", default="168h", help="how much history VACUUM keeps; the default is Delta's own"
    )
    args = parser.parse_args(argv)
    retain_ms = parse_duration(args.retain, "--retain", allow_zero=False)
    config = load_pipeline(args.pipeline)
    registry = TableRegistry(config, args.lakehouse)
    spark = build_session(f"tidemark-maintenance-{config.name}")
    # VACUUM lists a table's files in this many Spark tasks (10,000 by default): on a
    # small machine scheduling them, not the table's size, is what a VACUUM costs.
    listing_tasks = max(8, 4 * spark.sparkContext.defaultParallelism)
    spark.conf.set("spark.sql.sources.parallelPartitionDiscovery.parallelism", str(listing_tasks))
    log = RunLog(spark, "maintenance", registry)
    log.started()
    register_tables(spark, registry.all())
    lines = [maintain(spark, table, retain_ms) for table in registry.all()]
    lines += checkpoint_report(spark, registry)
    lines += archive_expiry(spark, registry)
    for line in lines:
        print(f"tidemark maintenance: {line}")
    log.ended("succeeded", RunTotals(batches=1), f"{len(registry.all())} tables maintained")
    return 0


if __name__ == "__main__":
    sys.exit(main())
