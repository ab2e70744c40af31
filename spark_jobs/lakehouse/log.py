"""What a Delta table's log tells without a Spark job, read on the driver: its latest
version, its commits and their labels (which stream batch wrote a commit), and whether
another writer changed some partitions since a version."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from spark_jobs.jvm import java_class
from spark_jobs.lakehouse.files import hadoop_file

FIRST_COMMIT = "00000000000000000000.json"


def has_commits(spark: SparkSession, path: str) -> bool:
    """Whether the table's log holds a commit or a checkpoint, without loading a
    snapshot. Only a log whose first commit was cleaned up and that has no
    ``_last_checkpoint`` is looked at the slow way, through an updated snapshot:
    Delta's ``isDeltaTable`` trusts a cached log, and one cached while another
    process was creating the table (its log folder made, its first commit not yet
    written) says "no table" until something updates it."""
    filesystem, log = hadoop_file(spark, path, "_delta_log")
    hadoop_path = java_class(spark, "org.apache.hadoop.fs.Path")
    if not filesystem.exists(log):
        return False
    if filesystem.exists(hadoop_path(log, FIRST_COMMIT)) or filesystem.exists(
        hadoop_path(log, "_last_checkpoint")
    ):
        return True
    return table_version(spark, path) >= 0


def created_ms(spark: SparkSession, path: str) -> int | None:
    """When the table's first commit was written (its file's modification time, in ms),
    or None once the log's cleanup has deleted it (the table is older than the log's
    retention)."""
    filesystem, first = hadoop_file(spark, path, "_delta_log", FIRST_COMMIT)
    if not filesystem.exists(first):
        return None
    return filesystem.getFileStatus(first).getModificationTime()


DELTA_LOG = "org.apache.spark.sql.delta.DeltaLog"


def _delta_log(spark: SparkSession, path: str) -> Any:
    """The table's DeltaLog in the JVM, for what the log tells without a Spark job."""
    return java_class(spark, DELTA_LOG).forTable(spark._jsparkSession, path)


HOURLY_LOG_CLEANUP = "io.tidemark.delta.HourlyLogCleanup"


def clean_up_log_after(spark: SparkSession, delta_log: Any, version: int) -> bool:
    """After the commit of ``version``, if it wrote a checkpoint: the log's entries past
    the table's retention deleted, the cutoff rounded down to the hour (Delta's own
    cleanup rounds it to midnight, so a log kept a day or two of commits, and every
    listing of it walked them all). True if the log was cleaned up."""
    return bool(java_class(spark, HOURLY_LOG_CLEANUP).afterCommit(delta_log, version))


def _log_changes(
    spark: SparkSession, path: str, start: int, end: int, fail_on_data_loss: bool
) -> Iterator[Any]:
    """(version, actions) of each commit from ``start`` to ``end`` (inclusive); a
    missing commit file is skipped, or raises with ``fail_on_data_loss``."""
    nothing = java_class(spark, "scala.Option").empty()
    changes = _delta_log(spark, path).getChanges(start, end, nothing, fail_on_data_loss)
    while changes.hasNext():
        yield changes.next()


def table_version(spark: SparkSession, path: str) -> int:
    """The Delta table's latest version, from its log on the driver (reading the
    history instead is a Spark job per call)."""
    nothing = java_class(spark, "scala.Option").empty()
    return _delta_log(spark, path).update(False, nothing, nothing).version()


def never_written(spark: SparkSession, path: str) -> bool:
    """Whether the table holds nothing but its creation (Tidemark creates its tables
    empty, as version 0), told from the log without a Spark job."""
    return table_version(spark, path) == 0


def readable_from_first_commit(spark: SparkSession, path: str, most: int) -> bool:
    """Whether a stream can read the Delta table commit by commit from its first: it
    has at most ``most`` commits after its creation, its log still holds them all, and
    only appends came after the creation (no commit removed a file, so VACUUM cannot
    have deleted one a commit added, and none changed the schema or protocol). Read
    from the log on the driver, no Spark job."""
    latest = table_version(spark, path)
    if latest > most:
        return False
    try:
        for version_actions in _log_changes(spark, path, 0, latest, fail_on_data_loss=True):
            rewrites = _REWRITE_ACTIONS if version_actions._1() > 0 else _FILE_REMOVALS
            if any(kind in rewrites for kind, _ in _actions(version_actions._2())):
                return False
    except Py4JJavaError:  # a commit file is gone (the log was cleaned up)
        return False
    return True


@dataclass(frozen=True)
class Commit:
    version: int
    timestamp_ms: int
    user_metadata: str | None
    operation: str = ""

    def writer(self) -> str:
        """Who made the commit, as its label tells: a stream's job and batch
        (:func:`batch_metadata`), another writer's own label, or Delta's operation."""
        batch = batch_label(self.user_metadata)
        if batch is not None:
            return f"the {batch.job or 'stream'} stream's batch {batch.batch_id}"
        return self.user_metadata or self.operation or "an unlabelled commit"


def commits(spark: SparkSession, path: str, start: int, end: int) -> list[Commit]:
    """The commit infos of versions ``start`` to ``end`` of a Delta table, read from
    its log on the driver, no Spark job."""
    found = []
    for version_actions in _log_changes(spark, path, max(start, 0), end, fail_on_data_loss=False):
        info = next((action for kind, action in _actions(version_actions._2()) if kind == "CommitInfo"), None)
        if info is not None:
            metadata = info.userMetadata()
            found.append(
                Commit(
                    version_actions._1(),
                    info.timestamp().getTime(),
                    metadata.get() if metadata.isDefined() else None,
                    info.operation(),
                )
            )
    return found


# The actions that change a Delta table's rows, each carrying its partition values.
_FILE_ACTIONS = frozenset({"AddFile", "RemoveFile", "AddCDCFile"})


# The actions that change what every row means.
_TABLE_ACTIONS = frozenset({"Metadata", "Protocol"})


# The actions after which a table is no longer its appends read in order.
_FILE_REMOVALS = frozenset({"RemoveFile"})


_REWRITE_ACTIONS = _FILE_REMOVALS | _TABLE_ACTIONS


def changed_by_others(
    spark: SparkSession,
    path: str,
    after: int,
    until: int,
    partitions: tuple[str, frozenset[str]],
    own: frozenset[str],
) -> bool:
    """Whether a commit in versions ``after`` + 1 to ``until`` of a Delta table changed
    the rows of some partitions (``(column, values)``) or the table's metadata, without
    the transaction id or userMetadata label of one of the app ids in ``own``. Read from the log on the driver
    (no Spark job), so a writer that keeps what it last wrote in memory can tell
    whether it must read the table again. A log that no longer holds every one of
    those commits (cleaned up), or a table younger than ``after`` (made again),
    counts as changed."""
    if until == after:
        return False
    if until < after:
        return True
    try:
        for version_actions in _log_changes(spark, path, after + 1, until, fail_on_data_loss=True):
            actions = version_actions._2()
            if _touches(actions, partitions) and not _written_by(actions, own):
                return True
    except Py4JJavaError:  # a commit file is gone: the log cannot vouch for the memory
        return True
    return False


def partition_files_since(
    spark: SparkSession,
    path: str,
    files: list[Any],
    after: int,
    until: int,
    partitions: tuple[str, frozenset[str]],
) -> list[Any] | None:
    """The data files (``AddFile``) of some partitions (``(column, values)``) at version
    ``until``, from ``files``, theirs at version ``after``, and the files the commits in
    between added and removed there (:func:`follow_files`); None where the log cannot tell."""
    current = {file.path(): file for file in files}
    return list(current.values()) if follow_files(spark, path, current, after, until, partitions) else None


Kept = TypeVar("Kept")


def follow_files(
    spark: SparkSession,
    path: str,
    files: dict[str, Kept],
    after: int,
    until: int,
    partitions: tuple[str, frozenset[str]] | None = None,
    keep: Callable[[Any], Kept] = lambda action: action,
) -> bool:
    """Bring ``files`` (a data file's path -> what is kept of its ``AddFile``, by
    ``keep``), the files at version ``after`` of some partitions (``(column, values)``;
    None: all), to version ``until``: the commits in between, read from the log on the
    driver (no Spark job), remove and add files there. Each call costs what those
    commits hold, however many files the table has, so a process that keeps a table's
    files follows other writers without rebuilding the table's state. False, and
    ``files`` undefined, where the log cannot tell: a commit is gone (cleaned up), one
    changed the table's metadata, removed a file not known to be there, or the table
    is younger than ``after`` (made again)."""
    if until < after:
        return False
    try:
        for version_actions in _log_changes(spark, path, after + 1, until, fail_on_data_loss=True):
            actions = list(_actions(version_actions._2()))
            if any(kind in _TABLE_ACTIONS for kind, _ in actions):
                return False
            # A commit that rewrites a file in place (a deletion vector) removes and adds one path.
            for kind, action in actions:
                removed = kind == "RemoveFile" and _in_partitions(action, partitions)
                if removed and files.pop(action.path(), None) is None:
                    return False
            for kind, action in actions:
                if kind == "AddFile" and _in_partitions(action, partitions):
                    files[action.path()] = keep(action)
    except Py4JJavaError:  # a commit file is gone: the log cannot tell the files
        return False
    return True


# The userMetadata entry naming the stream batch a commit lands: [app id, batch id].
BATCH_LABEL = "tidemark_batch"


# A stream's commits are stamped by its writer's clock and its birth by the file
# system's; the log is read back this far past its birth.
CLOCK_SKEW_MS = 3_600_000


# Commits read from the log per request when looking back.
LOOKBACK_CHUNK = 16


# The userMetadata entry naming the job whose stream wrote a commit.
JOB_LABEL = "tidemark_job"


def batch_metadata(app_id: str, batch_id: int, entries: dict[str, object], job: str | None = None) -> str:
    """A commit's userMetadata: ``entries`` and the label of batch ``batch_id`` of
    ``app_id``, the stream of ``job``."""
    named = {JOB_LABEL: job} if job else {}
    return json.dumps({**entries, **named, BATCH_LABEL: [app_id, batch_id]}, separators=(",", ":"))


@dataclass(frozen=True)
class BatchLabel:
    """What :func:`batch_metadata` wrote into a commit's userMetadata."""

    app_id: str
    batch_id: int
    job: str | None


def batch_label(label: str | None) -> BatchLabel | None:
    """The stream batch a commit's userMetadata names (:func:`batch_metadata`), if any."""
    if not label or BATCH_LABEL not in label:
        return None
    try:
        entries = json.loads(label)
        app_id, batch_id = entries[BATCH_LABEL]
    except (ValueError, TypeError, KeyError):
        return None
    return BatchLabel(app_id, batch_id, entries.get(JOB_LABEL))


def batch_landed(spark: SparkSession, path: str, app_id: str, batch_id: int, born_ms: int) -> bool:
    """Whether batch ``batch_id`` of the stream ``app_id`` (born at ``born_ms``) has
    committed to the table, by a labelled commit (:func:`batch_metadata`) or a Delta
    transaction id."""
    newest = newest_stream_commit(spark, path, app_id, born_ms)
    return newest is not None and newest[1] >= batch_id


def newest_stream_commit(spark: SparkSession, path: str, app_id: str, born_ms: int) -> tuple[int, int] | None:
    """(version, batch id) of the stream ``app_id``'s newest commit to the table, or
    None. Read from the log on the driver (no Spark job), from its latest version
    back: a stream's batches commit in order. A stream that never committed here is
    looked for back to commits older than itself."""
    latest = table_version(spark, path)
    for end in range(latest, -1, -LOOKBACK_CHUNK):
        start = max(0, end - LOOKBACK_CHUNK + 1)
        changes = list(_log_changes(spark, path, start, end, fail_on_data_loss=False))
        for version_actions in reversed(changes):
            found, timestamp_ms = _stream_batch(version_actions._2(), app_id)
            if found is not None:
                return version_actions._1(), found
            if timestamp_ms is not None and timestamp_ms < born_ms - CLOCK_SKEW_MS:
                return None
    return None


def _stream_batch(actions: Any, app_id: str) -> tuple[int | None, int | None]:
    """(the batch of ``app_id`` a commit lands, or None; the commit's timestamp)."""
    found, timestamp_ms = None, None
    for kind, action in _actions(actions):
        if kind == "SetTransaction" and action.appId() == app_id:
            found = action.version()
        if kind == "CommitInfo":
            timestamp_ms = action.timestamp().getTime()
            label = action.userMetadata()
            batch = batch_label(label.get()) if label.isDefined() else None
            if batch is not None and batch.app_id == app_id:
                found = batch.batch_id
    return found, timestamp_ms


def _actions(actions: Any) -> Iterator[tuple[str, Any]]:
    for index in range(actions.size()):
        action = actions.apply(index)
        yield action.getClass().getSimpleName(), action


def _touches(actions: Any, partitions: tuple[str, frozenset[str]]) -> bool:
    for kind, action in _actions(actions):
        if kind in _TABLE_ACTIONS:
            return True
        if kind in _FILE_ACTIONS and _in_partitions(action, partitions):
            return True
    return False


def _in_partitions(action: Any, partitions: tuple[str, frozenset[str]] | None) -> bool:
    """Whether a file action lands in the partitions ``(column, values)`` (None: any;
    an action without that partition column counts as landing everywhere)."""
    if partitions is None:
        return True
    column, values = partitions
    found = action.partitionValues().get(column)
    return not found.isDefined() or found.get() in values


def _written_by(actions: Any, app_ids: frozenset[str]) -> bool:
    """Whether a commit carries the transaction id, or the userMetadata label, of one of ``app_ids``."""
    for kind, action in _actions(actions):
        if kind == "SetTransaction" and action.appId() in app_ids:
            return True
        if kind == "CommitInfo":
            label = action.userMetadata()
            if label.isDefined() and label.get() in app_ids:
                return True
    return False


def discard_unfinished_creation(spark: SparkSession, path: str) -> bool:
    """Remove the ``_delta_log`` a creation killed before its first commit left
    behind (Delta makes ``_delta_log/_staged_commits`` first): Delta then takes the
    path for a table and fails to load it (DELTA_TABLE_NOT_FOUND), forever. Only a
    log without a single commit or checkpoint file is removed. True if one was."""
    filesystem, log = hadoop_file(spark, path, "_delta_log")
    if not filesystem.exists(log):
        return False
    if any(status.getPath().getName()[:1].isdigit() for status in filesystem.listStatus(log)):
        return False
    return bool(filesystem.delete(log, True))
