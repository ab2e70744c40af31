"""A lakehouse on a real S3 server (SeaweedFS on loopback): a store that cannot be
reached is a clear error within seconds and nothing is written; tables are created
there and committed to through Tidemark's log store."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from pyarrow import fs
from tidemark_airflow import lakehouse
from tidemark_airflow.health import liveness

from spark_jobs.config import ConfigError, load_pipeline
from spark_jobs.eventtime.clock import MAX_WATERMARK
from spark_jobs.generator import FleetSpec, Manifest, file_sender, generate
from spark_jobs.jobs import merge_late
from spark_jobs.jobs.replay import replay
from spark_jobs.lakehouse.create import create_missing
from spark_jobs.lakehouse.files import subfolder_sizes, visible_files
from spark_jobs.lakehouse.reachable import require_reachable
from spark_jobs.object_store import PORT_TAKEN, S3Server
from spark_jobs.servers import free_port
from spark_jobs.tables import TableRegistry
from tests.integration.conftest import PIPELINES, assert_bronze_reconciles, write_pipeline
from tests.integration.lakehouse_sql import (
    batch_gold,
    batch_silver,
    batch_status_events,
    engine_gold,
    engine_silver,
    engine_status_events,
    not_quarantined,
)
from tests.integration.test_late_merge import assert_reconciles, quarantine_by_status, statuses_of

pytestmark = [pytest.mark.spark]


def objects_under(server, prefix: str) -> list[str]:
    found = server.filesystem().get_file_info(fs.FileSelector(prefix, allow_not_found=True, recursive=True))
    return [info.path for info in found]


@pytest.fixture
def bucket_settings(spark):
    """Per-bucket S3A settings on the shared session, for buckets a test makes up."""
    configuration = spark._jsc.hadoopConfiguration()
    made = []

    def setting(bucket: str, key: str, value: str) -> None:
        configuration.set(f"fs.s3a.bucket.{bucket}.{key}", value)
        made.append(f"fs.s3a.bucket.{bucket}.{key}")

    yield setting
    for key in made:
        configuration.unset(key)


def test_a_lakehouse_whose_endpoint_answers_nothing_is_a_clear_error_within_seconds(
    spark, s3_server, bucket_settings
):
    bucket_settings("nowhere", "endpoint", f"http://127.0.0.1:{free_port()}")
    started = time.monotonic()
    with pytest.raises(
        ConfigError, match=r"--lakehouse: s3a://nowhere/lake: nothing answers at the endpoint"
    ):
        require_reachable(spark, "s3a://nowhere/lake")
    assert time.monotonic() - started < 30


def test_a_lakehouse_in_a_bucket_that_does_not_exist_is_a_clear_error(spark, s3_server):
    with pytest.raises(ConfigError, match=r"s3a://no-such-bucket/lake: the bucket does not exist"):
        require_reachable(spark, "s3a://no-such-bucket/lake")


def test_a_lakehouse_whose_credentials_the_store_refuses_is_a_clear_error(spark, s3_server, bucket_settings):
    bucket_settings(s3_server.bucket, "secret.key", "not-the-secret")
    with pytest.raises(ConfigError, match=r"the store refused the credentials"):
        require_reachable(spark, f"s3a://{s3_server.bucket}/lake-{uuid.uuid4().hex}")


def test_a_lakehouse_not_yet_written_in_a_reachable_bucket_is_fine(spark, s3_server):
    require_reachable(spark, f"s3a://{s3_server.bucket}/lake-{uuid.uuid4().hex}")


def test_creating_the_tables_with_refused_credentials_exits_with_the_reason_and_writes_nothing(
    s3_server, tmp_path
):
    root = f"{s3_server.bucket}/refused-{uuid.uuid4().hex}"
    environment = {**s3_server.environment(), "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    command = [
        str(Path(sys.executable).with_name("tidemark")),
        *(
            "tables",
            "--create",
            "--pipeline",
            str(PIPELINES / "telemetry.yaml"),
            "--lakehouse",
            f"s3a://{root}",
        ),
    ]
    started = time.monotonic()
    done = subprocess.run(
        command, env={**__import__("os").environ, **environment}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"--lakehouse: s3a://{root}: the store refused the credentials" in done.stderr
    # The JVM's start is most of it; the question itself fails at once.
    assert time.monotonic() - started < 60
    assert objects_under(s3_server, root) == []


def test_a_pipelines_tables_are_created_on_object_storage_and_found_there_the_second_time(spark, s3_server):
    registry = TableRegistry(
        load_pipeline(PIPELINES / "telemetry.yaml"), f"s3a://{s3_server.bucket}/lake-{uuid.uuid4().hex}"
    )
    created = create_missing(spark, registry)
    assert {table.sql_name for table in created} == {table.sql_name for table in registry.all()}
    assert create_missing(spark, registry) == []
    assert spark.read.format("delta").load(registry.bronze.path).schema == registry.bronze.schema


def test_the_visible_files_of_a_landing_folder_are_the_same_on_object_storage_as_on_a_disk(
    spark, s3_server, tmp_path
):
    prefix = f"{s3_server.bucket}/landing-{uuid.uuid4().hex}"
    store = s3_server.filesystem()
    names = ["part-0.json", "part-1.json", "_writing.json", ".hidden.json"]
    (tmp_path / "landing").mkdir()
    for name in names:
        (tmp_path / "landing" / name).write_text("{}\n")
        with store.open_output_stream(f"{prefix}/{name}") as stream:
            stream.write(b"{}\n")
    before_ms = time.time() * 1000 - 60_000
    on_disk = visible_files(spark, str(tmp_path / "landing"))
    on_s3 = visible_files(spark, f"s3a://{prefix}")
    assert set(on_disk) == set(on_s3) == {"part-0.json", "part-1.json"}
    assert all(at_ms > before_ms for at_ms in [*on_disk.values(), *on_s3.values()])
    assert visible_files(spark, f"s3a://{prefix}-absent") == {}


def test_the_live_feed_lands_its_files_on_object_storage(s3_server, monkeypatch, tmp_path):
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    prefix = f"{s3_server.bucket}/feed-{uuid.uuid4().hex}"
    send = file_sender(f"s3a://{prefix}", "json")
    batches = [generate(FleetSpec(devices=2, partitions=2, seed=seed, duration_ms=60_000)) for seed in (1, 2)]
    for batch in batches:
        send(batch)
    landed = sorted(objects_under(s3_server, prefix))
    assert len(landed) == 2 and landed == sorted(landed, key=lambda path: path.split("-")[-1])
    with s3_server.filesystem().open_input_stream(landed[0]) as stream:
        assert stream.read().decode().splitlines() == [record.line for record in batches[0]]
    assert list(tmp_path.iterdir()) == []  # nothing landed on the local disk


def test_the_sizes_of_checkpoint_folders_are_the_same_on_object_storage_as_on_a_disk(
    spark, s3_server, tmp_path
):
    prefix = f"{s3_server.bucket}/checkpoints-{uuid.uuid4().hex}"
    store = s3_server.filesystem()
    files = {"bronze/offsets/0": 10, "bronze/commits/0": 5, "silver/offsets/0": 7, "silver/metadata": 3}
    for name, size in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x" * size)
        with store.open_output_stream(f"{prefix}/{name}") as stream:
            stream.write(b"x" * size)
    expected = {"bronze": 15, "silver": 10}
    assert subfolder_sizes(spark, str(tmp_path)) == expected
    assert subfolder_sizes(spark, f"s3a://{prefix}") == expected
    assert subfolder_sizes(spark, f"s3a://{prefix}-absent") == {}


def test_a_streams_liveness_reads_the_same_from_a_checkpoint_on_object_storage_as_on_a_disk(
    s3_server, tmp_path, monkeypatch
):
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    prefix = f"{s3_server.bucket}/checkpoint-{uuid.uuid4().hex}"
    store = s3_server.filesystem()
    for name in ("offsets/0", "offsets/1", "offsets/2", "commits/0", "commits/1", "commits/.1.crc"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("v1\n")
        with store.open_output_stream(f"{prefix}/{name}") as stream:
            stream.write(b"v1\n")
    on_disk, on_s3 = liveness(str(tmp_path)), liveness(f"s3a://{prefix}")
    assert (on_disk.last_commit, on_disk.running_batch) == (on_s3.last_commit, on_s3.running_batch) == (1, 2)
    assert abs(on_s3.running_since - time.time()) < 60
    assert liveness(f"s3a://{prefix}-absent").last_commit is None


def test_a_replay_and_a_late_merge_on_object_storage_reconcile_and_equal_a_batch_computation(
    spark, s3_server, tmp_path, monkeypatch
):
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    pipeline = write_pipeline(tmp_path)
    fleet = generate(FleetSpec(devices=4, partitions=3, seed=11, duration_ms=40 * 60_000, late_ratio=0.05))
    source = tmp_path / "fleet.json"
    source.write_text("\n".join(record.line for record in fleet) + "\n")
    config = load_pipeline(pipeline)
    root = f"s3a://{s3_server.bucket}/replayed-{uuid.uuid4().hex}"
    assert replay(spark, config, source, root, batch_size=500, flush=True) == 0

    registry = TableRegistry(config, root)
    assert_bronze_reconciles(spark, registry, Manifest.of(fleet), fleet)
    assert_reconciles(spark, registry)
    pending = quarantine_by_status(spark, registry).get("pending", 0)
    assert pending > 0
    # Airflow's side reads the same tables on the store without Spark.
    assert lakehouse.pipeline_watermark(root, config.name) == MAX_WATERMARK
    assert lakehouse.quarantine_backlog(root, config.name)["late"] == pending
    on_time = not_quarantined(registry)
    assert engine_silver(spark, registry) == batch_silver(spark, registry, on_time)
    assert engine_gold(spark, registry) == batch_gold(spark, registry, on_time)

    # The late merge folds the quarantine in: then silver, gold and the status events are
    # the batch computation over all of bronze.
    assert merge_late.main(["--pipeline", str(pipeline), "--lakehouse", root]) == 0
    assert set(quarantine_by_status(spark, registry)) == {"merged"}
    assert statuses_of(spark, registry.late_tracks.path) == {"merged"}
    assert lakehouse.quarantine_backlog(root, config.name) == {"late": 0, "late_tracks": 0}
    [merge] = lakehouse.recent_runs(root, config.name, job="merge_late")
    assert merge["status"] == "succeeded" and merge["late"] == pending
    assert_reconciles(spark, registry)
    assert engine_silver(spark, registry) == batch_silver(spark, registry)
    assert engine_gold(spark, registry) == batch_gold(spark, registry)
    assert engine_status_events(spark, registry) == batch_status_events(spark, registry)
    # The landing zone is on the store too: nothing of the lakehouse on this machine's disk.
    assert objects_under(s3_server, f"{root.removeprefix('s3a://')}/_replay")
    assert not Path("s3a:").exists()


def test_a_server_whose_chosen_port_another_process_took_meanwhile_starts_on_new_ones(tmp_path):
    server = S3Server(tmp_path / "s3")
    taken_port = server.ports["master"]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", taken_port))
        taken.listen()
        server.start()
    try:
        assert server.ports["master"] != taken_port
        assert PORT_TAKEN in (tmp_path / "s3" / "server.log").read_bytes()
        assert server.filesystem().get_file_info(server.bucket).type == fs.FileType.Directory
    finally:
        server.stop()
