"""The file: scheme through the JVM (spark_jobs.posix_fs): Hadoop's answers, and no
readlink or chmod process for a file Delta or a stream writes."""

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from py4j.protocol import Py4JJavaError

from spark_jobs.jvm import java_class

pytestmark = pytest.mark.spark


@contextmanager
def processes_started(spark, recording_file: Path) -> Iterator[list[str]]:
    """The command lines of the processes the session's JVM starts inside the block,
    as the JVM's flight recorder saw them (its ``jdk.ProcessStart`` events)."""
    recording = java_class(spark, "jdk.jfr.Recording")()
    recording.enable("jdk.ProcessStart")
    recording.start()
    commands: list[str] = []
    try:
        yield commands
    finally:
        recording.stop()
        recorded = java_class(spark, "java.io.File")(str(recording_file)).toPath()
        recording.dump(recorded)
        recording.close()
        commands += [
            event.getString("command")
            for event in java_class(spark, "jdk.jfr.consumer.RecordingFile").readAllEvents(recorded)
        ]


def file_context(spark):
    return java_class(spark, "org.apache.hadoop.fs.FileContext").getFileContext(
        spark._jsc.hadoopConfiguration()
    )


def hadoop_path(spark, path: Path):
    return java_class(spark, "org.apache.hadoop.fs.Path")(path.as_uri())


def no_options(spark, kind: str):
    """An empty array for a Hadoop varargs parameter of ``Options$<kind>``."""
    return spark.sparkContext._gateway.new_array(java_class(spark, f"org.apache.hadoop.fs.Options${kind}"), 0)


def test_delta_commits_and_a_streams_checkpoint_start_no_process(spark, tmp_path):
    source, copy = tmp_path / "source", tmp_path / "copy"
    with processes_started(spark, tmp_path / "processes.jfr") as commands:
        spark.range(5).write.format("delta").save(str(source))
        spark.range(5, 8).write.format("delta").mode("append").save(str(source))
        (
            spark.readStream.format("delta")
            .load(str(source))
            .writeStream.format("delta")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start(str(copy))
            .awaitTermination()
        )
    assert sorted(row.id for row in spark.read.format("delta").load(str(copy)).collect()) == list(range(8))
    assert [command for command in commands if str(tmp_path) in command] == []


def test_a_rename_onto_an_existing_file_is_refused_and_leaves_both_files(spark, tmp_path):
    # Delta's commit is this rename: a version another writer took must fail it.
    taken, attempt = tmp_path / "00001.json", tmp_path / "attempt.tmp"
    taken.write_text("theirs")
    attempt.write_text("ours")
    with pytest.raises(Py4JJavaError, match="FileAlreadyExistsException"):
        file_context(spark).rename(
            hadoop_path(spark, attempt), hadoop_path(spark, taken), no_options(spark, "Rename")
        )
    assert (taken.read_text(), attempt.read_text()) == ("theirs", "ours")


def test_a_rename_to_a_free_name_moves_the_file_and_its_checksum(spark, tmp_path):
    written, renamed = tmp_path / "written", tmp_path / "renamed"
    context = file_context(spark)
    created = java_class(spark, "java.util.EnumSet").of(
        java_class(spark, "org.apache.hadoop.fs.CreateFlag").CREATE
    )
    stream = context.create(hadoop_path(spark, written), created, no_options(spark, "CreateOpts"))
    stream.write(b"ten bytes!")
    stream.close()
    context.rename(hadoop_path(spark, written), hadoop_path(spark, renamed), no_options(spark, "Rename"))
    assert sorted(path.name for path in tmp_path.iterdir()) == [".renamed.crc", "renamed"]
    assert renamed.read_bytes() == b"ten bytes!"


def test_link_statuses_are_hadoops_own_for_a_file_a_directory_and_a_symbolic_link(spark, tmp_path):
    (tmp_path / "file").write_text("four")
    (tmp_path / "directory").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "file")
    hadoops_own = java_class(spark, "org.apache.hadoop.fs.RawLocalFileSystem")()
    hadoops_own.initialize(java_class(spark, "java.net.URI")("file:///"), spark._jsc.hadoopConfiguration())

    def described(status) -> tuple:
        return (
            status.getPath().toString(),
            status.isFile(),
            status.isDirectory(),
            status.isSymlink(),
            status.getLen(),
        )

    for name in ("file", "directory", "link"):
        path = hadoop_path(spark, tmp_path / name)
        ours = file_context(spark).getFileLinkStatus(path)
        assert described(ours) == described(hadoops_own.getFileLinkStatus(path)), name


def test_the_link_status_of_a_missing_path_is_file_not_found(spark, tmp_path):
    with pytest.raises(Py4JJavaError, match="FileNotFoundException"):
        file_context(spark).getFileLinkStatus(hadoop_path(spark, tmp_path / "missing"))


@pytest.mark.parametrize(("mode", "directory"), [(0o640, False), (0o705, False), (0o1777, True)])
def test_permissions_are_set_exactly_sticky_bit_included(spark, tmp_path, mode, directory):
    path = tmp_path / "entry"
    path.mkdir() if directory else path.write_text("x")
    path.chmod(0o600)
    permission = java_class(spark, "org.apache.hadoop.fs.permission.FsPermission")(f"{mode:o}")
    file_system = hadoop_path(spark, path).getFileSystem(spark._jsc.hadoopConfiguration())
    file_system.setPermission(hadoop_path(spark, path), permission)
    assert stat.S_IMODE(os.stat(path).st_mode) == mode
