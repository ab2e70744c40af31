import hashlib
import io

import pytest

from spark_jobs import jars


def test_an_unknown_jar_target_is_refused_with_the_targets_there_are():
    with pytest.raises(
        SystemExit,
        match=r"unknown jar targets \['sprak'\]; choose from \['spark', 'token-provider', 's3a', 'kafka'\]",
    ):
        jars.main(["spark", "sprak"])


def test_the_process_started_for_a_target_resolves_it_and_says_where(monkeypatch, tmp_path, capsys):
    resolved = []
    monkeypatch.setattr(jars, "resolve_one", lambda which: resolved.append(which) or [tmp_path / "a.jar"])
    jars.main([jars.IN_PROCESS, "kafka"])
    assert resolved == ["kafka"]
    assert capsys.readouterr().out == f"tidemark: 1 kafka jars in {tmp_path}\n"


def test_a_pinned_jar_is_fetched_from_its_maven_central_path():
    pin = jars.PinnedJar("io.delta:delta-storage:4.4.0", "0" * 64)
    assert pin.url() == "https://repo1.maven.org/maven2/io/delta/delta-storage/4.4.0/delta-storage-4.4.0.jar"


def test_the_pins_hold_the_delta_and_kafka_connector_of_the_installed_pyspark_and_delta_spark():
    pinned = {pin.coordinates for pin in jars.SPARK_JARS}
    assert set(jars.maven_packages()) <= pinned


def test_the_s3a_pins_hold_hadoop_aws_of_the_hadoop_pyspark_ships():
    shipped = {jar.name for jar in jars._pyspark_jars() if jar.name.startswith("hadoop-client-api-")}
    hadoop = {
        f"hadoop-client-api-{pin.coordinates.split(':')[2]}.jar"
        for pin in jars.S3A_JARS
        if ":hadoop-aws:" in pin.coordinates
    }
    assert shipped and hadoop == shipped


class Served:
    """What urlopen answers for each address, as a context manager like its response."""

    def __init__(self, bodies: dict[str, bytes]) -> None:
        self.bodies = bodies

    def __call__(self, url: str, timeout: float) -> io.BytesIO:
        return io.BytesIO(self.bodies[url])


def pinned(coordinates: str, content: bytes) -> jars.PinnedJar:
    return jars.PinnedJar(coordinates, hashlib.sha256(content).hexdigest())


def test_fetched_jars_replace_the_folder_under_the_names_ivy_gives_them(monkeypatch, tmp_path):
    target = tmp_path / "jars"
    target.mkdir()
    (target / "stale-1.0.jar").write_bytes(b"old")
    pins = (pinned("org.example:one_2.13:1.2", b"first"), pinned("org.example:two:3.4.5", b"second"))
    monkeypatch.setattr(
        jars.urllib.request,
        "urlopen",
        Served({pin.url(): body for pin, body in zip(pins, [b"first", b"second"], strict=True)}),
    )
    fetched = jars.fetch(pins, target)
    assert [jar.name for jar in fetched] == ["org.example_one_2.13-1.2.jar", "org.example_two-3.4.5.jar"]
    assert [jar.read_bytes() for jar in fetched] == [b"first", b"second"]
    assert sorted(path.name for path in target.iterdir()) == [jar.name for jar in fetched]


def test_a_jar_that_differs_from_its_pin_is_refused_and_the_folder_kept(monkeypatch, tmp_path):
    target = tmp_path / "jars"
    target.mkdir()
    (target / "kept-1.0.jar").write_bytes(b"kept")
    pin = pinned("org.example:one:1.0", b"what was pinned")
    monkeypatch.setattr(jars.urllib.request, "urlopen", Served({pin.url(): b"something else"}))
    with pytest.raises(RuntimeError, match=r"org\.example:one:1\.0 is pinned at " + pin.sha256):
        jars.fetch((pin,), target)
    assert [(path.name, path.read_bytes()) for path in target.iterdir()] == [("kept-1.0.jar", b"kept")]
