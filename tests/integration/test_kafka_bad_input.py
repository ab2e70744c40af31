"""Bad input on the Kafka path, through the real bronze job and a real broker: values
that are not text, null values, huge messages, keys of any kind and headers. Every
message is one bronze row or one reject with its reason, each at its own offset."""

from __future__ import annotations

import json

import pytest
from kafka import KafkaProducer
from pyspark.sql import functions as F

from tests.integration.engine import BASE_MS, run_jobs
from tests.integration.test_source_partitions import kafka_pipeline

pytestmark = [pytest.mark.spark]

# Just under the broker's default largest message (1 MiB) once encoded.
HUGE_PADDING = 900_000


def valid(seconds: int, device: str = "d1", **extra) -> dict:
    return {
        "device_id": device,
        "ts": BASE_MS + seconds * 1000,
        "region": "r1",
        "battery": 50.0,
        "speed": 3.0,
        "partition": 0,
        **extra,
    }


def text(payload: dict) -> bytes:
    return json.dumps(payload).encode()


# (what is sent: key, value, headers; the reason bronze must give it, None for a row)
MESSAGES = [
    (None, text(valid(1)), None, None),
    (b"\x00\xff binary key", text(valid(2)), None, None),
    (b"d1", text(valid(3)), [("trace", b"\x01\x02"), ("empty", b"")], None),
    (None, text(valid(4, note="x" * HUGE_PADDING)), None, None),
    (b"k", None, None, "empty_record"),
    (b"tombstone", None, [("why", b"compaction")], "empty_record"),
    (None, b"", None, "empty_record"),
    (None, b"\xff\xfe\x00\x9f not UTF-8 at all", None, "malformed_record"),
    (None, bytes(range(256)), None, "malformed_record"),
    (None, b"{" + b"x" * HUGE_PADDING, None, "malformed_record"),
    (None, text(valid(5, battery="full")), None, "wrong_type"),
    (None, b"[1, 2, 3]", None, "malformed_record"),
]


def test_every_kafka_message_is_a_bronze_row_or_a_reject_with_its_reason(spark, tmp_path, kafka_broker):
    _, registry = kafka_pipeline(tmp_path, kafka_broker, "bad_input", idleness="1h")
    producer = KafkaProducer(
        bootstrap_servers=kafka_broker.bootstrap_servers, acks="all", max_request_size=2 * 1024 * 1024
    )
    try:
        for key, value, headers, _ in MESSAGES:
            producer.send("bad_input", value=value, key=key, headers=headers, partition=0)
        producer.flush()
    finally:
        producer.close()

    run_jobs(spark, registry, "bronze")

    bronze = spark.read.format("delta").load(registry.bronze.path)
    rejects = (
        spark.read.format("delta")
        .load(registry.ops["rejects"].path)
        .where(F.col("pipeline") == registry.config.name)
    )
    expected_rows = {index for index, message in enumerate(MESSAGES) if message[3] is None}
    assert {row.source_offset for row in bronze.select("source_offset").collect()} == expected_rows
    assert sorted(tuple(row) for row in rejects.select("source_offset", "reason").collect()) == [
        (index, reason) for index, (_, _, _, reason) in enumerate(MESSAGES) if reason is not None
    ]
    # Nothing lost, nothing doubled: one row or one reject per offset.
    assert bronze.count() + rejects.count() == len(MESSAGES)
    huge = bronze.where(F.col("source_offset") == 3).select("ts", "device_id").first()
    assert (huge.ts, huge.device_id) == (BASE_MS + 4_000, "d1")
