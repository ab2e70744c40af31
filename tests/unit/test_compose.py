"""docker-compose.yml: valid for Debian's docker-compose (`config` resolves the file
without a Docker engine) and consistent with the code it deploys: the Spark
connection reaches the master service, the ports are the code's defaults, the
lakehouse is one volume at one path, images are pinned, services are health-checked
and started in order, and no secret is written in the file."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from spark_jobs import object_store
from spark_jobs.config import load_pipeline
from spark_jobs.session import is_local_master
from spark_jobs.sql_client import DEFAULT_PORT as SQL_PORT

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
ENV_TEMPLATE = REPO / "spark_jobs" / "docker" / "tidemark.env.example"
PIPELINES = REPO / "spark_jobs" / "pipelines"
LAKEHOUSE = "/opt/tidemark/lakehouse"
AIRFLOW = ("airflow-api-server", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")
SERVICES = {
    "postgres",
    "airflow-init",
    *AIRFLOW,
    "spark-master",
    "spark-worker-1",
    "spark-worker-2",
    "kafka",
    "sql-server",
    "generator",
}
OBJECT_STORAGE = {"object-store"}
SECRET = re.compile(r"PASSWORD|SECRET|FERNET|JWT", re.IGNORECASE)
# A release, not a moving tag: x.y.z (PostgreSQL's releases are x.y), a variant suffix allowed.
EXACT_TAG = re.compile(r"^[\w./-]+:\d+\.\d+(\.\d+)?(-[\w.]+)*$")


def compose_binary() -> list[str]:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    pytest.fail("no docker-compose: `make compose` installs Debian's")


def compose_config(env_file: Path, home: Path) -> subprocess.CompletedProcess:
    """`config` with only ``env_file`` as the source of variables (no exported ones)."""
    command = [*compose_binary(), "--project-directory", str(REPO), "-f", str(COMPOSE)]
    return subprocess.run(
        [*command, "--env-file", str(env_file), "config"],
        env={"PATH": os.environ["PATH"], "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> dict:
    done = compose_config(ENV_TEMPLATE, tmp_path_factory.mktemp("compose-home"))
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def services(config: dict) -> dict:
    return config["services"]


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(entry.split("=", 1) for entry in env)
    return {key: "" if value is None else str(value) for key, value in env.items()}


def published(service: dict) -> dict[int, tuple[str, int]]:
    """Container port -> (host address, host port), from either `config` dialect."""
    found = {}
    for port in service.get("ports", []):
        if isinstance(port, dict):
            found[int(port["target"])] = (port.get("host_ip", ""), int(port["published"]))
        else:
            host_ip, host_port, target = str(port).split("/")[0].rsplit(":", 2)
            found[int(target)] = (host_ip, int(host_port))
    return found


def mounts(service: dict) -> dict[str, str]:
    """Volume name -> path in the container."""
    found = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            found[volume["source"]] = volume["target"]
        else:
            source, target = volume.split(":")[:2]
            found[source] = target
    return found


def option(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def template() -> dict[str, str]:
    lines = ENV_TEMPLATE.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def test_the_file_describes_the_whole_topology(config):
    assert set(services(config)) - OBJECT_STORAGE == SERVICES
    # Object storage is an option: its services start only with their profile.
    raw = yaml.safe_load(COMPOSE.read_text())["services"]
    assert {name for name, service in raw.items() if service.get("profiles")} == OBJECT_STORAGE


def test_the_object_store_is_the_tests_server_reachable_from_the_other_services(config):
    service = services(config)["object-store"]
    module = ["python", "-m", "spark_jobs.object_store"]
    assert service["command"][: len(module)] == module
    args = object_store.argument_parser().parse_args(service["command"][len(module) :])
    assert args.bind == "0.0.0.0"
    assert f"TIDEMARK_S3_ENDPOINT=http://object-store:{args.port}" in ENV_TEMPLATE.read_text()
    assert f"TIDEMARK_LAKEHOUSE=s3a://{args.bucket}/" in ENV_TEMPLATE.read_text()
    # Its identity is the one every job reaches it with.
    server, job = environment(service), environment(services(config)["airflow-scheduler"])
    assert server["AWS_ACCESS_KEY_ID"] == job["AWS_ACCESS_KEY_ID"] == template()["S3_ACCESS_KEY"]
    assert server["AWS_SECRET_ACCESS_KEY"] == job["AWS_SECRET_ACCESS_KEY"] == template()["S3_SECRET_KEY"]


def test_no_secret_is_written_in_the_file_and_a_missing_one_stops_compose(config, tmp_path):
    raw = "\n".join(line for line in COMPOSE.read_text().splitlines() if not line.lstrip().startswith("#"))
    for key, value in re.findall(r"^\s*([A-Z_]+):\s*(.+)$", raw, re.MULTILINE):
        if SECRET.search(key):
            assert re.fullmatch(r"\$\{\w+:?[-?][^}]*\}", value.strip()), f"{key} is written in the file"
    required = set(re.findall(r"\$\{(\w+):\?", raw))
    assert required and required <= set(template()), "the env template lacks a required variable"
    # The template's placeholders reach the services, so they are what a deployment sets.
    airflow_env = environment(services(config)["airflow-scheduler"])
    assert airflow_env["AIRFLOW__CORE__FERNET_KEY"] == template()["AIRFLOW_FERNET_KEY"]
    without = tmp_path / "incomplete.env"
    without.write_text(ENV_TEMPLATE.read_text().replace("POSTGRES_PASSWORD=", "#"))
    refused = compose_config(without, tmp_path)
    assert refused.returncode != 0 and "POSTGRES_PASSWORD" in refused.stderr


def test_images_are_pinned_to_exact_versions(config):
    dockerfiles = []
    for name, service in services(config).items():
        assert EXACT_TAG.match(service["image"]), f"{name}: {service['image']} is not an exact version"
        if "build" in service:
            dockerfiles.append(Path(service["build"]["context"]) / service["build"]["dockerfile"])
    bases = {}
    for dockerfile in set(dockerfiles):
        assert dockerfile.is_file() and dockerfile.is_relative_to(REPO), dockerfile
        for base in re.findall(r"^FROM\s+(\S+)", dockerfile.read_text(), re.MULTILINE):
            assert EXACT_TAG.match(base), f"{dockerfile}: FROM {base} is not an exact version"
            bases[dockerfile.parent.parent.name] = base
    # Airflow's image is the version the tests run; the Spark image's Python is the
    # version the Airflow image's drivers run (PySpark requires the same minor version).
    airflow_pin = re.search(r"^apache-airflow==(\S+)$", (REPO / "requirements.txt").read_text(), re.MULTILINE)
    assert bases["plugins"] == f"apache/airflow:{airflow_pin[1]}-python3.11"
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", bases["spark_jobs"])
    for name in AIRFLOW:
        executor_python = environment(services(config)[name])["TIDEMARK_EXECUTOR_PYTHON"]
        assert executor_python == "/usr/local/bin/python3.11"  # the python image's interpreter


def test_long_running_services_are_health_checked_and_started_in_order(config):
    every = services(config)
    one_shot = {name for name, service in every.items() if service.get("restart") == "no"}
    assert one_shot - OBJECT_STORAGE == {"airflow-init", "generator"}
    for name, service in every.items():
        if name not in one_shot:
            assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
        for needed, condition in (service.get("depends_on") or {}).items():
            expected = "service_completed_successfully" if needed in one_shot else "service_healthy"
            assert condition["condition"] == expected, f"{name} -> {needed}"
    # A start order exists (no cycle), and the scheduler, which submits the jobs,
    # starts after everything a job needs.
    started, pending = [], dict(every)
    while pending:
        ready = [n for n, s in pending.items() if set(s.get("depends_on") or {}) <= set(started)]
        assert ready, f"a dependency cycle among {sorted(pending)}"
        for name in ready:
            started.append(name)
            del pending[name]
    scheduler_needs = set(every["airflow-scheduler"]["depends_on"])
    assert {"postgres", "airflow-init", "spark-master", "spark-worker-1", "spark-worker-2", "kafka"} <= (
        scheduler_needs
    )
    for name in ("spark-worker-1", "spark-worker-2"):
        assert "spark-master" in every[name]["depends_on"]


def test_the_spark_connection_reaches_the_master_service(config, monkeypatch):
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    every = services(config)
    connections = {environment(every[name])["AIRFLOW_CONN_TIDEMARK_SPARK"] for name in AIRFLOW}
    assert len(connections) == 1
    # The provider reads the connection exactly as the operators will.
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_COMPOSE_TEST", connections.pop())
    master = SparkSubmitHook(conn_id="tidemark_compose_test")._connection["master"]
    assert not is_local_master(master)
    host, port = master.removeprefix("spark://").split(":")
    spark_master = every["spark-master"]
    assert spark_master["hostname"] == host and option(spark_master["command"], "--host") == host
    assert option(spark_master["command"], "--port") == port
    ui_port = option(spark_master["command"], "--webui-port")
    assert f"localhost:{ui_port}/" in " ".join(spark_master["healthcheck"]["test"])
    for name in ("spark-worker-1", "spark-worker-2"):
        command = every[name]["command"]
        assert command[:2] == ["spark-class", "org.apache.spark.deploy.worker.Worker"]
        assert command[2] == master
    # Tasks reach the api-server's execution API by its service name and port.
    api_url = environment(every["airflow-scheduler"])["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"]
    assert api_url == "http://airflow-api-server:8080/execution/"
    assert published(every["airflow-api-server"])[8080][1] == 8080


def test_ports_are_the_code_defaults_and_published_on_loopback_only(config):
    every = services(config)
    sql = every["sql-server"]
    assert sql["command"][:2] == ["tidemark", "sql-server"]
    assert option(sql["command"], "--port") == str(SQL_PORT)
    assert option(sql["command"], "--host") == "0.0.0.0"  # reachable from other containers
    assert published(sql)[SQL_PORT] == ("127.0.0.1", SQL_PORT)
    # Kafka: the shipped Kafka pipeline's broker (127.0.0.1:9092) is the host's published
    # port, which reaches the listener that advertises exactly that address.
    kafka_env = environment(every["kafka"])
    native = load_pipeline(PIPELINES / "clickstream.yaml").source.bootstrap_servers
    host, port = native.split(":")
    listeners = dict(entry.split("://") for entry in kafka_env["KAFKA_LISTENERS"].split(","))
    advertised = dict(entry.split("://") for entry in kafka_env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    external = next(name for name, address in advertised.items() if address == native)
    external_port = int(listeners[external].rsplit(":", 1)[1])
    assert published(every["kafka"])[external_port] == (host, int(port))
    # Inside the network the pipelines reach the INTERNAL listener by the service name.
    assert advertised["INTERNAL"] == f"kafka:{listeners['INTERNAL'].rsplit(':', 1)[1]}"
    for service in every.values():
        args = (service.get("build") or {}).get("args") or {}
        if "KAFKA_BOOTSTRAP" in args:
            assert args["KAFKA_BOOTSTRAP"] == advertised["INTERNAL"]
    for name, service in every.items():
        for host_ip, _ in published(service).values():
            assert host_ip == "127.0.0.1", f"{name} publishes beyond loopback"


def test_the_lakehouse_is_one_volume_at_one_path_wherever_spark_code_runs(config):
    every = services(config)
    writers = {*AIRFLOW, "airflow-init", "spark-worker-1", "spark-worker-2", "sql-server", "generator"}
    for name in writers:
        assert mounts(every[name]).get("lakehouse") == LAKEHOUSE, name
        env = environment(every[name])
        if name != "airflow-init":
            assert env["LAKEHOUSE_DIR"] == LAKEHOUSE, name
            assert env["TIDEMARK_PIPELINES"] == "/opt/tidemark/pipelines", name
    assert "lakehouse" in config["volumes"]
    for dockerfile in ("spark_jobs/docker/Dockerfile", "plugins/docker/Dockerfile"):
        text = (REPO / dockerfile).read_text()
        assert f"LAKEHOUSE_DIR={LAKEHOUSE}" in text and "TIDEMARK_JARS_DIR=/opt/tidemark/jars/spark" in text


def test_deployment_pipelines_are_the_shipped_ones_with_kafka_at_its_service(tmp_path):
    subprocess.run(
        [
            "sh",
            str(REPO / "spark_jobs" / "docker" / "deployment-pipelines.sh"),
            str(PIPELINES),
            str(tmp_path),
        ],
        env={"PATH": os.environ["PATH"], "KAFKA_BOOTSTRAP": "kafka:9092"},
        check=True,
    )
    shipped = sorted(path.name for path in PIPELINES.glob("*.yaml"))
    assert sorted(path.name for path in tmp_path.glob("*.yaml")) == shipped
    for name in shipped:
        original, deployed = (PIPELINES / name).read_text(), (tmp_path / name).read_text()
        if load_pipeline(PIPELINES / name).source.kind == "kafka":
            assert load_pipeline(tmp_path / name).source.bootstrap_servers == "kafka:9092"
            assert deployed == original.replace("127.0.0.1:9092", "kafka:9092")
        else:
            assert deployed == original


def test_the_images_setup_script_runs_only_modules_that_do_something_when_run():
    # A module without a __main__ block runs and exits 0 having done nothing: the image
    # would then lack Tidemark's jar and fail its first job, not its build.
    script = (REPO / "spark_jobs" / "docker" / "install-jars.sh").read_text()
    modules = re.findall(r"^python -m ([\w.]+)", script, re.MULTILINE)
    assert "spark_jobs.java_build" in modules
    for module in modules:
        source = REPO / (module.replace(".", "/") + ".py")
        assert 'if __name__ == "__main__":' in source.read_text(), module
