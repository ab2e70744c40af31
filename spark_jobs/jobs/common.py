"""What every streaming job shares: arguments, triggers, checkpoints, the run log,
and the app id that makes Delta writes idempotent under batch replays."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from spark_jobs.arguments import BAD_INPUT, FAILED, TRIGGERS, config_error_message, print_error, with_examples
from spark_jobs.config import PIPELINE_HELP, ConfigError, PipelineConfig, load_pipeline, parse_duration
from spark_jobs.jvm import error_summary
from spark_jobs.lakehouse.checkpoints import (
    born_ms,
    damaged_log_files,
    discard_unfinished_first_batch,
    repair_command,
    stream_app_id,
)
from spark_jobs.lakehouse.commit_files import DamagedCommits
from spark_jobs.lakehouse.create import create_missing
from spark_jobs.lakehouse.log import batch_landed, batch_metadata, newest_stream_commit
from spark_jobs.lakehouse.runs import RunLog, RunTotals
from spark_jobs.lakehouse.space import full_disk_hint, out_of_space
from spark_jobs.lakehouse.transaction import Transaction
from spark_jobs.session import (
    DEFAULT_MASTER,
    build_session,
    is_local_master,
    profile_for_trigger,
    session_master,
)
from spark_jobs.sources.progress import SourceProgress
from spark_jobs.tables import TableRef, TableRegistry, join


def job_parser(job: str, description: str, examples: Sequence[str] = ()) -> argparse.ArgumentParser:
    """A streaming job's parser; ``examples`` (default: a continuous and an
    available-now run of the demo pipeline) end its help."""
    parser = argparse.ArgumentParser(prog=f"tidemark {job}", description=description)
    runs = (
        f"tidemark {job} --pipeline telemetry --interval 30s",
        f"tidemark {job} --pipeline telemetry --trigger available-now",
    )
    with_examples(parser, *(examples or runs))
    parser.add_argument("--pipeline", required=True, help=PIPELINE_HELP)
    parser.add_argument("--lakehouse", help="lakehouse root (default: $LAKEHOUSE_DIR or ./lakehouse)")
    parser.add_argument(
        "--trigger",
        choices=TRIGGERS,
        default=TRIGGERS[0],
        help="continuous: a micro-batch every --interval; available-now: drain the backlog and exit",
    )
    parser.add_argument("--interval", default="10s", help="micro-batch interval in continuous mode")
    parser.add_argument(
        "--checkpoint", help="checkpoint folder (default: <lakehouse>/_checkpoints/<pipeline>/<job>)"
    )
    return parser


@dataclass
class JobContext:
    job: str
    config: PipelineConfig
    registry: TableRegistry
    trigger: str
    interval_ms: int
    checkpoint: str
    # What the source reports with the run's n-th micro-batch, where the caller
    # knows it better than the source reader (a replay's bounded input).
    reported_progress: Callable[[int], SourceProgress] | None = None

    @classmethod
    def from_args(cls, job: str, args: argparse.Namespace) -> JobContext:
        """Every argument checked before the caller starts Spark."""
        config = load_pipeline(args.pipeline)
        interval = parse_duration(args.interval, "--interval", allow_zero=False)
        registry = TableRegistry(config, folder_argument(args.lakehouse, "--lakehouse"))
        checkpoint = folder_argument(args.checkpoint, "--checkpoint")
        checkpoint = checkpoint or default_checkpoint(registry, job)
        return cls(job, config, registry, args.trigger, interval, checkpoint)


def stream_session(context: JobContext) -> SparkSession:
    """A stream job's session, its JVM under the profile its trigger calls for (when this
    process starts the JVM; under spark-submit the command line chose)."""
    local = is_local_master(session_master() or DEFAULT_MASTER)
    profile = profile_for_trigger(context.trigger, local)
    return build_session(f"tidemark-{context.job}-{context.config.name}", default_profile=profile)


def default_checkpoint(registry: TableRegistry, job: str) -> str:
    """Where ``job`` keeps its checkpoint unless told otherwise, alone or in ``tidemark run``."""
    return join(registry.root, "_checkpoints", registry.config.name, job)


def folder_argument(path: str | None, field: str) -> str | None:
    """``path`` unless it names something other than a folder (local paths only:
    a URL is checked by whoever opens it)."""
    if path is not None and "://" not in path and os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(field, f"{path} is not a folder")
    return path


def query_name(context: JobContext) -> str:
    return f"tidemark-{context.job}-{context.config.name}"


def stream_busy(stream: Stream) -> bool:
    """Whether ``stream``'s query has a batch at work or input waiting for its next
    trigger: False once the query has ended, or while it waits for input."""
    for query in stream.spark.streams.active:
        if query.name == query_name(stream.context):
            status = query.status
            return bool(status["isTriggerActive"] or status["isDataAvailable"])
    return False


def start_stream(
    frame: DataFrame, context: JobContext, batch_writer: Callable[[DataFrame, int], None]
) -> StreamingQuery:
    discard_unfinished_first_batch(frame.sparkSession, context.checkpoint)
    writer = (
        frame.writeStream.foreachBatch(batch_writer)
        .option("checkpointLocation", context.checkpoint)
        .queryName(query_name(context))
    )
    if context.trigger == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{context.interval_ms} milliseconds")
    return writer.start()


class BatchWriter:
    """A ``foreachBatch`` function with what every job's writer needs: the session,
    the job context, the run totals, and the query id its Delta writes carry."""

    def __init__(self, spark: SparkSession, context: JobContext, totals: RunTotals) -> None:
        self.spark = spark
        self.context = context
        self.totals = totals
        self._app_id: str | None = None
        self.last_completed: int | None = None

    @property
    def app_id(self) -> str:
        self._app_id = self._app_id or stream_app_id(self.spark, self.context.checkpoint)
        return self._app_id

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        try:
            self.write_batch(batch, batch_id)
        except BaseException:
            # Part of it may have landed: whatever runs next must look.
            self.last_completed = None
            raise
        self.last_completed = batch_id

    def write_batch(self, batch: DataFrame, batch_id: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """What the writer does once its query has stopped (after a failure too)."""

    def label(self, batch_id: int, entries: dict[str, object] | None = None) -> str:
        """The userMetadata of this stream's commits for batch ``batch_id``: what it
        writes, which stream and batch wrote it (:func:`~spark_jobs.tables.batch_metadata`)."""
        return batch_metadata(self.app_id, batch_id, entries or {}, self.context.job)

    def follows_completed(self, batch_id: int) -> bool:
        """Whether ``batch_id`` comes right after a batch this writer completed, with
        no failure since: it is new. A batch whose checkpoint entry failed after its
        writes is replayed under its own id, never followed by the next."""
        return self.last_completed is not None and batch_id == self.last_completed + 1

    def append_once(
        self,
        frame: DataFrame,
        table: TableRef,
        batch_id: int,
        metadata: dict[str, object] | None = None,
        written: Callable[[], dict[str, object]] | None = None,
    ) -> bool:
        """Append ``frame`` to ``table`` unless this stream's batch ``batch_id`` already
        landed there; True if it wrote. Not through a Delta transaction id: checking one
        rebuilds the table's state from its log on every append (a Spark job). A batch
        that follows one this writer completed appends at once; any other (a
        stream's first batch, maybe the replay of one that landed before a crash)
        first reads the log back for its label, which the commit carries in its
        userMetadata beside ``metadata`` and ``written()``, entries known once the
        files are written (what an observation of ``frame`` counted)."""
        if self.landed(table, batch_id):
            return False
        txn = Transaction(self.spark, table.path)
        added = txn.write(frame)
        entries = {**(metadata or {}), **(written() if written else {})}
        txn.commit_append(added, self.label(batch_id, entries))
        return True

    def landed(self, table: TableRef, batch_id: int) -> bool:
        """Whether this stream's batch ``batch_id`` already committed to ``table`` under
        its label (:func:`~spark_jobs.tables.batch_metadata`). A batch that follows one
        this writer completed has not; any other is looked for in the table's log."""
        return not self.follows_completed(batch_id) and batch_landed(
            self.spark, table.path, self.app_id, batch_id, self.born_ms()
        )

    def landed_commit(self, table: TableRef, batch_id: int) -> int | None:
        """The version of this stream's commit of batch ``batch_id`` to ``table``, if it
        landed; None if it did not (:meth:`landed`)."""
        if self.follows_completed(batch_id):
            return None
        newest = newest_stream_commit(self.spark, table.path, self.app_id, self.born_ms())
        return newest[0] if newest is not None and newest[1] == batch_id else None

    def born_ms(self) -> int:
        """When the stream's checkpoint (and with it its app id) was made."""
        return born_ms(self.spark, self.context.checkpoint)


@dataclass
class Stream:
    """A job's streaming query, ready to start: what a driver needs to run it, alone
    or beside the other jobs of its pipeline."""

    spark: SparkSession
    context: JobContext
    start: Callable[[], StreamingQuery]
    totals: RunTotals
    close: Callable[[], None] = lambda: None


def writer_stream(
    spark: SparkSession,
    context: JobContext,
    source: Callable[[], DataFrame],
    writer_type: Callable[[SparkSession, JobContext, RunTotals], BatchWriter],
) -> Stream:
    """Create the pipeline's missing tables; the stream runs ``source`` through a
    ``foreachBatch`` writer of ``writer_type``."""
    create_missing(spark, context.registry)
    totals = RunTotals()
    writer = writer_type(spark, context, totals)
    return Stream(spark, context, lambda: start_stream(source(), context, writer), totals, writer.close)


POLL_S = 0.5


def run_streams(streams: list[Stream]) -> int:
    """Run ``streams`` side by side in this driver until all end, each a logged run;
    SIGTERM (Airflow's on_kill) stops them all at a batch boundary. The first query
    to fail stops the others, so the process exits 1 and its supervisor restarts the
    whole set. Returns the process exit code."""
    logs = [RunLog(stream.spark, stream.context.job, stream.context.registry) for stream in streams]
    for log in logs:
        log.started()
    queries: list[StreamingQuery] = []
    stopped: list[int] = []

    def stop(signum: int, frame: object) -> None:
        stopped.append(signum)
        for query in queries:
            query.stop()

    signal.signal(signal.SIGTERM, stop)
    closing: dict[int, str] = {}
    try:
        queries.extend(stream.start() for stream in streams)
        failed = wait_for_streams(queries)
    finally:
        for query in queries:
            query.stop()  # a failure stops its siblings; after a success they have all ended
        # Every stream closes, and an error raised while starting is the one that stands.
        for index, stream in enumerate(streams):
            try:
                stream.close()
            except Exception as error:
                closing[index] = f"failed when closing: {error}"[:2000]
                print(f"tidemark {stream.context.job}: {closing[index]}", file=sys.stderr)
    unrecorded = False
    for index, (stream, query, log) in enumerate(zip(streams, queries, logs, strict=True)):
        status, message = "succeeded", None
        error = query.exception()
        if error is not None:
            hint = failure_hint(stream, str(error))
            if hint:
                print(f"tidemark {stream.context.job}: {hint}", file=sys.stderr)
            status, message = "failed", f"{hint} {error}"[:2000] if hint else str(error)[:2000]
        elif index in closing:
            status, message = "failed", closing[index]
        elif stopped or failed:
            status, message = "stopped", None if stopped else "stopped: a query beside it failed"
        try:
            log.ended(status, stream.totals, message)
        except Exception as error:  # a full disk fails the run log too: the cause above stands
            unrecorded = True
            unlogged = f"could not log the run's end: {error_summary(error)}"
            print(f"tidemark {stream.context.job}: {unlogged}", file=sys.stderr)
    return 1 if failed or closing or unrecorded else 0


def failure_hint(stream: Stream, error: str) -> str | None:
    """What to do about a stream's failure, where Tidemark can tell: a full disk, or a
    checkpoint file a crash of the machine damaged."""
    if out_of_space(error):
        return full_disk_hint(stream.context.registry.root)
    return repair_hint(stream)


def repair_hint(stream: Stream) -> str | None:
    """What to do about a checkpoint log file a crash of the machine left incomplete
    (Spark's own error names it, or only the JSON it could not parse); None when the
    stream's checkpoint is whole."""
    context = stream.context
    try:
        damaged = damaged_log_files(stream.spark, context.checkpoint)
    except Exception as error:  # a store that failed the stream may fail this too
        print(
            f"tidemark {context.job}: could not check the checkpoint's logs: {error}"[:500], file=sys.stderr
        )
        return None
    if not damaged:
        return None
    files = " and ".join(file.path for file in damaged)
    command = repair_command(context.config.source_file or context.config.name, context.registry.root)
    return (
        f"the checkpoint file {files} is damaged; {command} removes it where that is safe; "
        "then start the job again"
    )


def wait_for_streams(queries: list[StreamingQuery]) -> bool:
    """Wait until every query has ended or one has failed; True if one failed. The
    queries may belong to different sessions, so no session's query manager sees
    them all: wait on the first live one, a moment at a time."""
    while True:
        if any(not query.isActive and query.exception() is not None for query in queries):
            return True
        live = [query for query in queries if query.isActive]
        if not live:
            return False
        with contextlib.suppress(StreamingQueryException):  # seen as its exception() next round
            live[0].awaitTermination(POLL_S)


def run_stream(stream: Stream) -> int:
    return run_streams([stream])


def run_if_configured(stream: Stream | None, context: JobContext, section: str) -> int:
    """Run ``stream``; a job whose pipeline section is absent (no stream) succeeds."""
    if stream is None:
        return nothing_to_do(context.job, context.registry, section)
    return run_stream(stream)


def nothing_to_do(job: str, registry: TableRegistry, section: str) -> int:
    """A job whose pipeline section is absent succeeds: one orchestration serves
    every pipeline, and a missing section is not a failure."""
    print(f"tidemark {job}: pipeline {registry.config.name!r} has no {section} section; nothing to do")
    return 0


def exit_with_named_errors(main: Callable[[list[str] | None], int]) -> Callable[[list[str] | None], int]:
    """A bad argument or pipeline file exits 2 with the culprit named on stderr, in
    the form argparse uses for malformed arguments (``tidemark <job>: error: ...``);
    main raises ConfigError before Spark starts. A table's damaged last commit exits 1
    naming it and the repair (before the job writes anything); a full disk exits 1 with its trace
    and a last line that says so."""
    # The job's command, from its module's file: spark-submit runs it as __main__.
    command = Path(main.__code__.co_filename).stem.replace("_", "-")

    @functools.wraps(main)
    def wrapped(argv: list[str] | None = None) -> int:
        try:
            return main(argv)
        except ConfigError as error:
            print_error(command, config_error_message(error))
            return BAD_INPUT
        except DamagedCommits as error:
            print_error(command, str(error))
            return FAILED
        except Exception as error:
            if not out_of_space(error):
                raise
            traceback.print_exc()
            print_error(command, full_disk_hint())
            return FAILED

    return wrapped
