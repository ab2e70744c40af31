"""Setup compiles Tidemark's JVM classes into the same jar every time."""

import zipfile

import pytest

from spark_jobs import java_build, posix_fs
from spark_jobs.sources.files import JSON_LINES


def test_two_builds_of_the_same_sources_are_the_same_jar_byte_for_byte(tmp_path):
    first, second = java_build.build(tmp_path / "first"), java_build.build(tmp_path / "second")
    assert first.name == second.name == java_build.JAR_NAME
    assert first.read_bytes() == second.read_bytes()


def test_the_jar_holds_every_class_the_session_names(tmp_path):
    with zipfile.ZipFile(java_build.build(tmp_path)) as jar:
        entries = set(jar.namelist())
    named = {
        class_name.replace(".", "/") + ".class"
        for class_name in (*posix_fs.HADOOP_CONF.values(), *posix_fs.LOG_STORE_CONF.values(), JSON_LINES)
    }
    assert named <= entries


def test_without_javac_setup_names_the_jdk_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(java_build.shutil, "which", lambda _: None)
    with pytest.raises(RuntimeError, match="openjdk-17-jdk-headless"):
        java_build.build(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_source_that_does_not_compile_fails_with_the_compilers_message_and_no_jar(monkeypatch, tmp_path):
    sources = tmp_path / "java"
    sources.mkdir()
    (sources / "Broken.java").write_text("class Broken { int x = ; }\n")
    monkeypatch.setattr(java_build, "SOURCES", sources)
    with pytest.raises(RuntimeError, match=r"javac failed:(.|\n)*Broken\.java"):
        java_build.build(tmp_path / "jar")
    assert not (tmp_path / "jar").exists()
