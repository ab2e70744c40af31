"""A stream killed while writing its first offset can start again.

Spark writes each checkpoint log entry to ``.<batch>.<uuid>.tmp`` and renames it;
a kill -9 between the two leaves the temporary file, and on the next start Spark
refuses batch 0 because ``offsets`` is not empty (found by the fault-injection
suite: the gold job could never run again)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException

from spark_jobs.config import load_pipeline
from spark_jobs.jobs.common import JobContext, start_stream
from spark_jobs.lakehouse.checkpoints import discard_unfinished_first_batch, stream_app_id
from spark_jobs.tables import TableRegistry
from tests.unit.test_config import PIPELINES

pytestmark = pytest.mark.spark


def landed_json(folder: Path, records: int) -> Path:
    folder.mkdir()
    (folder / "part-0.json").write_text("".join(json.dumps({"n": n}) + "\n" for n in range(records)))
    return folder


def leave_unfinished_first_offset(checkpoint: Path) -> list[Path]:
    """What CheckpointFileManager.createAtomic leaves when killed before its rename."""
    offsets = checkpoint / "offsets"
    offsets.mkdir(parents=True, exist_ok=True)
    temporary = offsets / f".0.{uuid.uuid4()}.tmp"
    temporary.write_text('v1\n{"batchWatermarkMs":0')
    checksum = offsets / f".{temporary.name}.crc"
    checksum.write_bytes(b"crc")
    return [temporary, checksum]


def context_for(checkpoint: Path, lakehouse: Path) -> JobContext:
    config = load_pipeline(PIPELINES / "telemetry.yaml")
    registry = TableRegistry(config, str(lakehouse))
    return JobContext("gold", config, registry, "available-now", 1000, str(checkpoint))


def test_spark_alone_refuses_to_start_over_an_unfinished_first_offset(spark, tmp_path):
    source = landed_json(tmp_path / "landing", 5)
    checkpoint = tmp_path / "checkpoint"
    leave_unfinished_first_offset(checkpoint)
    query = (
        spark.readStream.schema("n LONG")
        .json(str(source))
        .writeStream.foreachBatch(lambda frame, batch: None)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(StreamingQueryException, match="STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY"):
        query.awaitTermination()


def test_a_job_stream_starts_over_an_unfinished_first_offset_and_reads_everything(spark, tmp_path):
    source = landed_json(tmp_path / "landing", 7)
    checkpoint = tmp_path / "checkpoint"
    leftovers = leave_unfinished_first_offset(checkpoint)
    seen: list[int] = []

    def count_rows(frame, batch_id: int) -> None:
        seen.append(frame.count())

    query = start_stream(
        spark.readStream.schema("n LONG").json(str(source)),
        context_for(checkpoint, tmp_path / "lakehouse"),
        count_rows,
    )
    query.awaitTermination()
    assert sum(seen) == 7
    assert not any(path.exists() for path in leftovers)
    assert (checkpoint / "offsets" / "0").exists()


def test_a_checkpoint_with_a_logged_batch_is_left_as_it_is(spark, tmp_path):
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "offsets" / "0").write_text("v1\n")
    leftovers = leave_unfinished_first_offset(checkpoint)
    assert discard_unfinished_first_batch(spark, str(checkpoint)) == []
    assert all(path.exists() for path in leftovers)


def test_only_temporary_files_are_removed_from_a_checkpoint_without_batches(spark, tmp_path):
    checkpoint = tmp_path / "checkpoint"
    leftovers = leave_unfinished_first_offset(checkpoint)
    stranger = checkpoint / "offsets" / "notes.txt"
    stranger.write_text("not Spark's")
    removed = discard_unfinished_first_batch(spark, str(checkpoint))
    # The local filesystem lists a file without its checksum and deletes both.
    assert [Path(path).name for path in removed] == [leftovers[0].name]
    assert not any(path.exists() for path in leftovers)
    assert stranger.exists()


def test_the_app_id_of_a_stream_is_its_query_id_and_survives_a_restart(spark, tmp_path):
    source = landed_json(tmp_path / "landing", 3)
    checkpoint = tmp_path / "checkpoint"
    context = context_for(checkpoint, tmp_path / "lakehouse")
    ids, seen = [], []

    def count_rows(frame, batch_id: int) -> None:
        seen.append(frame.count())

    for _ in range(2):
        query = start_stream(spark.readStream.schema("n LONG").json(str(source)), context, count_rows)
        query.awaitTermination()
        ids.append(str(query.id))
    assert ids[0] == ids[1] == stream_app_id(spark, str(checkpoint))
    assert sum(seen) == 3  # the restart resumed: nothing read twice
