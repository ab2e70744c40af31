"""``tidemark check-idle``: the idleness check an orchestrator runs every few minutes.

1. Looks for backlogs: landing files bronze has not ingested yet (files
   sources), bronze versions silver has not judged yet.
2. When silver has nothing left to judge, takes one watermark step without
   records (:func:`spark_jobs.engine.watermark_steps.advance_idle`): partitions quiet for
   the idleness timeout become idle, the watermark moves, and the windows it
   passed fire through silver's own firing update. The streaming gold and
   offline jobs take the step from silver's change feed and watermark history,
   so due rollups and OFFLINE timers follow through their usual code path.
3. Reports a stalled stream, one whose backlog is older than ``--stall-after``,
   and exits 3 so the orchestrator's task fails and someone looks.

Kafka lag is backlog: the topic's latest offsets, asked of the brokers now,
against the end offsets bronze's last batch reported. A lagging partition is
never made idle, and a lag whose bronze has not committed for ``--stall-after``
is a stalled bronze (the Airflow page reports it by the same rule).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_jobs.arguments import with_examples
from spark_jobs.config import PIPELINE_HELP, load_pipeline, parse_duration
from spark_jobs.engine.clocks import judged_version
from spark_jobs.engine.watermark_steps import advance_idle
from spark_jobs.jobs.common import default_checkpoint, exit_with_named_errors, folder_argument
from spark_jobs.lakehouse.create import create_missing
from spark_jobs.lakehouse.files import visible_files
from spark_jobs.lakehouse.log import table_version
from spark_jobs.lakehouse.reads import change_feed
from spark_jobs.lakehouse.runs import RunLog, RunTotals
from spark_jobs.session import build_session
from spark_jobs.sources import latest_source_report
from spark_jobs.sources.files import committed_landing_files
from spark_jobs.sources.kafka import KafkaBacklog, KafkaLatestOffsets, kafka_backlog
from spark_jobs.sources.progress import DEFAULT_STALL_AFTER
from spark_jobs.tables import TableRegistry

STALLED_EXIT = 3


@dataclass
class Health:
    unread_files: int = 0
    oldest_unread_file: datetime | None = None
    unjudged_versions: int = 0
    oldest_unjudged_version: datetime | None = None
    kafka_lag: dict[str, int] = field(default_factory=dict)
    kafka_unknown: bool = False
    stalled: list[str] = field(default_factory=list)


def unread_landing_files(
    spark: SparkSession, registry: TableRegistry, bronze_checkpoint: str
) -> dict[str, datetime]:
    folder = registry.landing_path
    if registry.config.source.kind != "files" or folder is None:
        return {}
    landed = visible_files(spark, folder)
    if not landed:
        return {}
    ingested = committed_landing_files(spark, bronze_checkpoint)
    return {
        name: datetime.fromtimestamp(at_ms / 1000, UTC)
        for name, at_ms in landed.items()
        if name not in ingested
    }


def unjudged_versions(spark: SparkSession, registry: TableRegistry) -> tuple[int, datetime | None]:
    """(bronze versions with records silver has not judged, the oldest one's commit time)."""
    judged = judged_version(spark, registry)
    first = 0 if judged is None else judged + 1
    latest = table_version(spark, registry.bronze.path)
    if latest < first:
        return 0, None
    pending = (
        change_feed(spark.read, registry.bronze.path, first, latest)
        .agg(F.count_distinct("_commit_version"), F.min("_commit_timestamp"))
        .first()
    )
    oldest = pending[1]
    return pending[0], None if oldest is None else oldest.replace(tzinfo=UTC)


def kafka_backlog_now(spark: SparkSession, registry: TableRegistry) -> KafkaBacklog | None:
    """The topic now against bronze's last report; None for a files source and before
    bronze's first batch. A broker that does not answer is a stall of its own."""
    source = registry.config.source
    last = latest_source_report(spark, registry) if source.kind == "kafka" else None
    if last is None:
        return None
    offsets = KafkaLatestOffsets(source.bootstrap_servers, source.topic)
    try:
        return kafka_backlog(last[1], offsets)
    finally:
        offsets.close()


def inspect(
    spark: SparkSession, registry: TableRegistry, now: datetime, stall_after_ms: int, bronze_checkpoint: str
) -> Health:
    health = Health()
    try:
        backlog = kafka_backlog_now(spark, registry)
    except Exception as error:  # kafka-python raises many kinds: each means "unknown"
        source = registry.config.source
        health.stalled.append(f"bronze: Kafka at {source.bootstrap_servers} does not answer ({error})")
        health.kafka_unknown = True
        backlog = None
    if backlog is not None:
        health.kafka_lag = backlog.lag
        stalled = backlog.stall(now, stall_after_ms)
        health.stalled += [stalled] if stalled else []
    unread = unread_landing_files(spark, registry, bronze_checkpoint)
    health.unread_files = len(unread)
    health.oldest_unread_file = min(unread.values(), default=None)
    health.unjudged_versions, health.oldest_unjudged_version = unjudged_versions(spark, registry)

    def overdue(since: datetime | None) -> bool:
        return since is not None and (now - since).total_seconds() * 1000 >= stall_after_ms

    if overdue(health.oldest_unread_file):
        health.stalled.append(
            f"bronze: {health.unread_files} landing files unread, the oldest landed at "
            f"{health.oldest_unread_file:%Y-%m-%d %H:%M:%S} UTC"
        )
    if overdue(health.oldest_unjudged_version):
        health.stalled.append(
            f"silver: {health.unjudged_versions} bronze versions not judged, the oldest committed at "
            f"{health.oldest_unjudged_version:%Y-%m-%d %H:%M:%S} UTC"
        )
    return health


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tidemark check-idle",
        description="Mark idle partitions, advance the watermark of quiet streams, report stalled ones.",
    )
    with_examples(
        parser,
        "tidemark check-idle --pipeline telemetry",
        "tidemark check-idle --pipeline telemetry --stall-after 15m",
    )
    parser.add_argument("--pipeline", required=True, help=PIPELINE_HELP)
    parser.add_argument("--lakehouse", help="lakehouse root (default: $LAKEHOUSE_DIR or ./lakehouse)")
    parser.add_argument(
        "--bronze-checkpoint",
        help="bronze's checkpoint folder, for the landing files it has read "
        "(default: <lakehouse>/_checkpoints/<pipeline>/bronze, as bronze's own default)",
    )
    parser.add_argument(
        "--stall-after",
        default=DEFAULT_STALL_AFTER,
        help="a backlog older than this means its stream is stalled: exit 3",
    )
    return parser


@exit_with_named_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    stall_after_ms = parse_duration(args.stall_after, "--stall-after", allow_zero=False)
    config = load_pipeline(args.pipeline)
    registry = TableRegistry(config, folder_argument(args.lakehouse, "--lakehouse"))
    bronze_checkpoint = folder_argument(args.bronze_checkpoint, "--bronze-checkpoint")
    bronze_checkpoint = bronze_checkpoint or default_checkpoint(registry, "bronze")
    spark = build_session(f"tidemark-check-idle-{config.name}")
    create_missing(spark, registry)
    log = RunLog(spark, "check_idle", registry)
    log.started()
    now = datetime.now(UTC)
    health = inspect(spark, registry, now, stall_after_ms, bronze_checkpoint)
    # With Kafka's offsets unknown no partition is known to be caught up: no step.
    busy = health.unjudged_versions or health.kafka_unknown
    step = None if busy else advance_idle(spark, registry, now, backlog=health.kafka_lag)
    if step is None:
        moved = "silver busy: watermark left to it" if health.unjudged_versions else "watermark unchanged"
    else:
        moved = (
            f"watermark {step.watermark_before} -> {step.watermark_after} "
            f"({step.active_partitions} active, {step.idle_partitions} idle partitions)"
        )
    lag = ", ".join(f"{partition}: {records}" for partition, records in sorted(health.kafka_lag.items()))
    backlog = [f"Kafka lag {lag} (backlog: never idle)"] if lag else []
    message = "; ".join([moved, *backlog, *health.stalled])
    print(f"tidemark check-idle {config.name}: {message}")
    log.ended("failed" if health.stalled else "succeeded", RunTotals(batches=int(step is not None)), message)
    if health.stalled:
        print("tidemark check-idle: stalled: " + " | ".join(health.stalled), file=sys.stderr)
        return STALLED_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
