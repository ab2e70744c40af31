"""A Delta table's last commit file as a crash of the machine may leave it: empty, or cut
short, because the file was renamed into place before its bytes reached the disk.

Delta would read an empty commit as a version with no actions (the batch it held silently
gone), and a cut one fails with a parse error that names nothing. Every job looks at the
last commit of each table before it starts (:func:`require_whole_commits`); ``tidemark
repair`` removes a damaged one where the stream batch that wrote it runs again."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from spark_jobs.jvm import java_class
from spark_jobs.lakehouse.checkpoints import UnsafeRepair, born_ms, log_batches, stream_app_id
from spark_jobs.lakehouse.files import hadoop_file, read_text
from spark_jobs.lakehouse.log import BatchLabel, batch_label, newest_stream_commit

LOG_FILES = "io.tidemark.delta.LogFiles"


def lines(text: str) -> list[str]:
    """A commit's lines, split at newlines only: a JSON string may hold U+2028 or U+0085
    unescaped, which ``str.splitlines`` would take for line ends."""
    return text.split("\n")


def is_whole_commit(text: str) -> bool:
    """Whether ``text`` is a whole commit file as Delta writes one: one JSON action per
    line, each line ended, a ``commitInfo`` among them."""
    if not text.endswith("\n"):
        return False
    kinds = set()
    for line in lines(text[:-1]):
        try:
            action = json.loads(line)
        except ValueError:
            return False
        if not isinstance(action, dict) or len(action) != 1:
            return False
        kinds.update(action)
    return "commitInfo" in kinds


def commit_label(text: str) -> BatchLabel | None:
    """The stream batch a (possibly damaged) commit's surviving ``commitInfo`` names."""
    for line in lines(text):
        try:
            info = json.loads(line).get("commitInfo")
        except (ValueError, AttributeError):
            continue
        if isinstance(info, dict):
            return batch_label(info.get("userMetadata"))
    return None


@dataclass(frozen=True)
class DamagedCommit:
    """The last commit file of a table, not whole; ``label`` is the stream batch that
    wrote it where its ``commitInfo`` line survived."""

    table: str
    version: int
    path: str
    label: BatchLabel | None


class DamagedCommits(RuntimeError):
    """Tables whose last commit file a crash of the machine left incomplete."""

    def __init__(self, damaged: list[DamagedCommit], repair: str) -> None:
        files = " and ".join(commit.path for commit in damaged)
        super().__init__(
            f"the Delta commit file {files} is damaged (cut short by a crash of the machine); "
            f"{repair} removes it where that is safe, then start the job again"
        )
        self.damaged = damaged


def damaged_commits(spark: Any, tables: Iterable[str]) -> list[DamagedCommit]:
    """The tables' last commit files that are not whole; a crash damages no other. One
    call into the JVM per table: an answer past about 8 KB waits some 40 ms on Py4J's
    socket, so the tables are not asked together."""
    configuration = spark.sparkContext._jsc.hadoopConfiguration()
    log_files = java_class(spark, LOG_FILES)
    damaged = []
    for table in tables:
        newest = log_files.newestCommits(configuration, table)
        if not newest:
            continue
        _, version, text = newest[:-1].split("\n", 2)
        if not is_whole_commit(text):
            path = hadoop_file(spark, table, "_delta_log", f"{int(version):020d}.json")[1].toString()
            damaged.append(DamagedCommit(table, int(version), path, commit_label(text)))
    return damaged


def require_whole_commits(spark: Any, tables: Iterable[str], repair: str) -> None:
    """Raise :class:`DamagedCommits` naming every table of ``tables`` whose last commit
    file is damaged, and ``repair``, the command that repairs them."""
    damaged = damaged_commits(spark, tables)
    if damaged:
        raise DamagedCommits(damaged, repair)


def table_id_before(spark: Any, table: str, version: int) -> str | None:
    """The table's id as of ``version`` - 1, from the checksum file Delta writes beside
    each commit; None where that file is missing."""
    filesystem, checksum = hadoop_file(spark, table, "_delta_log", f"{version - 1:020d}.crc")
    if version == 0 or not filesystem.exists(checksum):
        return None
    return json.loads(read_text(spark, checksum.toString()))["metadata"]["id"]


def reads_from(offsets_text: str, table_id: str, version: int) -> bool:
    """Whether a stream's offsets file (``offsets/<n>``) reaches ``version`` of the Delta
    table ``table_id`` or beyond: the batch read or will read it."""
    for entry in offsets_text.splitlines()[2:]:
        try:
            offset = json.loads(entry)
        except ValueError:
            continue
        if isinstance(offset, dict) and offset.get("reservoirId") == table_id:
            read_to, index = offset["reservoirVersion"], offset.get("index", -1)
            if read_to > version or (read_to == version and index >= 0):
                return True
    return False


def repair_commit(
    spark: Any,
    damaged: DamagedCommit,
    checkpoints: Mapping[str, str],
    tables: Iterable[str],
    input_removed: frozenset[str] = frozenset(),
) -> list[str]:
    """Remove a damaged last commit file where the stream batch that wrote it runs again,
    and return the removed paths; raise :class:`UnsafeRepair`, removing nothing, where it
    cannot.

    ``checkpoints`` are the pipeline's streams (job -> checkpoint), ``tables`` its tables,
    ``input_removed`` the jobs whose input is moved or deleted once a batch commits. The
    commit's surviving ``commitInfo`` names the stream batch *b* that wrote it. Safe when
    that stream is one of ``checkpoints`` and its input is kept, no other stream's offsets
    reach the damaged version, and no table holds a later batch of the writer. Then the
    writer's commit of *b* and its plans after *b* go too: Spark runs *b* again from its
    offsets, every table skips a batch it holds, and the damaged table takes *b* afresh."""
    label = damaged.label
    refusal = f"{damaged.path} is damaged, but "
    if label is None:
        raise UnsafeRepair(refusal + "what is left of it does not say which writer made it. " + BY_HAND)
    writers = [job for job, path in checkpoints.items() if stream_app_id(spark, path) == label.app_id]
    if not writers:
        stranger = f"it holds batch {label.batch_id} of a stream not among {sorted(checkpoints)}. "
        raise UnsafeRepair(refusal + stranger + BY_HAND)
    writer = writers[0]
    if writer in input_removed:
        raise UnsafeRepair(
            refusal + f"batch {label.batch_id} of {writer} would run again, and its landed files were "
            "moved or deleted once it committed. " + BY_HAND
        )
    table_id = table_id_before(spark, damaged.table, damaged.version)
    for job, checkpoint in checkpoints.items():
        planned = log_batches(spark, checkpoint, "offsets")
        if job == writer or not planned:
            continue
        text = read_text(spark, checkpoint, "offsets", str(planned[-1]))
        # Without the table's id, any stream reading some Delta table may have read this one.
        unknown = table_id is None and "reservoirVersion" in text
        if unknown or (table_id is not None and reads_from(text, table_id, damaged.version)):
            read = f"the {job} stream may have read version {damaged.version} of {damaged.table}. "
            raise UnsafeRepair(refusal + read + BY_HAND)
    checkpoint = checkpoints[writer]
    born = born_ms(spark, checkpoint)
    for table in tables:
        newest = None if table == damaged.table else newest_stream_commit(spark, table, label.app_id, born)
        if newest is not None and newest[1] > label.batch_id:
            raise UnsafeRepair(
                refusal + f"batch {newest[1]} of {writer}, after the damaged batch {label.batch_id}, "
                f"committed to {table}. " + BY_HAND
            )
    doomed = [
        hadoop_file(spark, checkpoint, folder, str(batch))
        for folder, after in (("offsets", label.batch_id + 1), ("commits", label.batch_id))
        for batch in log_batches(spark, checkpoint, folder)
        if batch >= after
    ]
    doomed.append(hadoop_file(spark, damaged.table, "_delta_log", f"{damaged.version:020d}.crc"))
    doomed.append(hadoop_file(spark, damaged.path))
    removed = []
    for filesystem, path in doomed:
        if filesystem.delete(path, False):
            removed.append(path.toString())
    return removed


# Where a damaged commit cannot be removed in place.
BY_HAND = (
    "It cannot be repaired in place: restore the table's _delta_log from a backup, or rebuild the "
    "tables from the input with tidemark replay (docs/concepts/exactly-once.md#damaged-commit-files)"
)
