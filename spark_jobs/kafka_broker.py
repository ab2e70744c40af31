"""A real Apache Kafka broker in KRaft mode, from the jars resolved at setup.

Tests and the demo start one on loopback: ``KafkaBroker(folder).start()``, or
``python -m spark_jobs.kafka_broker --port 9092 --dir lakehouse/_kafka`` in the
foreground. One process is both controller and broker; nothing listens beyond
127.0.0.1.
"""

from __future__ import annotations

import argparse
import base64
import os
import subprocess
import time
import uuid
from pathlib import Path

from spark_jobs.jars import _pyspark_jars, kafka_jars_dir
from spark_jobs.servers import free_port, serve_in_foreground, stop_group
from spark_jobs.session import JVM_PROFILES, SERIAL_COLLECTOR

# The broker here serves tests and the demo beside Spark on the same few cores, a few
# thousand records/s at most: C1 alone and the serial collector (short jobs' flags),
# whose compiler and collector threads take less of those cores than the JDK's defaults.
BROKER_JAVA_OPTIONS = [*JVM_PROFILES["short-jobs"].java_options.split(), SERIAL_COLLECTOR]


def _classpath() -> str:
    broker_jars = sorted(kafka_jars_dir().glob("*.jar"))
    if not broker_jars:
        raise RuntimeError(f"no Kafka jars in {kafka_jars_dir()}: run `make setup` first")
    # Ivy leaves scala-library out (Spark provides it); pyspark ships a 2.13 one.
    scala = [jar for jar in _pyspark_jars() if jar.name.startswith("scala-library-")]
    return os.pathsep.join(str(jar) for jar in [*broker_jars, *scala])


def _cluster_id() -> str:
    """Kafka's base64 UUID; one that starts with '-' would read as a command-line option."""
    while True:
        candidate = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not candidate.startswith("-"):
            return candidate


class KafkaBroker:
    def __init__(
        self, folder: str | Path, port: int | None = None, controller_port: int | None = None
    ) -> None:
        self.folder = Path(folder)
        self.port = port or free_port()
        self.controller_port = controller_port or free_port()
        self.process: subprocess.Popen | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _write_config(self) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.folder / "data"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
        }
        config = self.folder / "server.properties"
        config.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        return config

    def _java(self, main_class: str, *args: str) -> list[str]:
        return ["java", "-Xmx512m", *BROKER_JAVA_OPTIONS, "-cp", _classpath(), main_class, *args]

    def start(self, timeout_s: float = 60.0) -> KafkaBroker:
        config = self._write_config()
        if not (self.folder / "data" / "meta.properties").exists():
            formatted = subprocess.run(
                self._java("kafka.tools.StorageTool", "format", "-t", _cluster_id(), "-c", str(config)),
                capture_output=True,
                text=True,
            )
            if formatted.returncode:
                raise RuntimeError(f"formatting Kafka storage failed: {formatted.stdout}{formatted.stderr}")
        log = open(self.folder / "broker.log", "ab")  # noqa: SIM115 - owned by the process
        self.process = subprocess.Popen(
            self._java("kafka.Kafka", str(config)),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"Kafka broker exited with {self.process.returncode}; see {self.folder}/broker.log"
                )
            if self._ready():
                return self
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"Kafka broker not ready on {self.bootstrap_servers} after {timeout_s}s")

    def _ready(self) -> bool:
        from kafka import KafkaAdminClient
        from kafka.errors import KafkaError

        try:
            admin = KafkaAdminClient(bootstrap_servers=self.bootstrap_servers, request_timeout_ms=2_000)
        except (KafkaError, OSError, ValueError):
            return False
        try:
            admin.list_topics()
            return True
        except (KafkaError, OSError):
            return False
        finally:
            admin.close()

    def create_topic(self, topic: str, partitions: int) -> None:
        from kafka import KafkaAdminClient
        from kafka.admin import NewTopic

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap_servers)
        try:
            admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
        finally:
            admin.close()

    def stop(self) -> None:
        stop_group(self.process)


def main() -> None:
    parser = argparse.ArgumentParser(description="Run a KRaft Kafka broker on loopback in the foreground.")
    parser.add_argument("--port", type=int, default=9092)
    parser.add_argument("--dir", default="lakehouse/_kafka")
    args = parser.parse_args()
    broker = KafkaBroker(args.dir, args.port)
    serve_in_foreground(broker, f"Kafka broker ready on {broker.bootstrap_servers} (data in {args.dir})")


if __name__ == "__main__":
    main()
