"""Hadoop's local file system without its shell-outs, built once at setup.

Without Hadoop's native library, which pip's pyspark does not ship, Hadoop's local
file system starts a ``readlink`` for every link status (a rename asks for four:
source, destination and their checksum files) and a ``chmod`` for every file it
creates. Every Delta commit and every streaming checkpoint file on a local disk
started 5 processes, about 3 ms of CPU each: 11,900 in 6 minutes of two
integration test files. The classes in ``spark_jobs/java`` do both through the
JVM. ``python -m spark_jobs.posix_fs`` (run by ``make setup``) compiles them
against pyspark's own Hadoop into :func:`spark_jobs.jars.posix_fs_dir`, which
:func:`spark_jobs.jars.local_jars` puts on every session's class path;
:data:`HADOOP_CONF` makes them the ``file:`` scheme's file systems.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from spark_jobs.jars import _pyspark_jars, posix_fs_dir

SOURCES = Path(__file__).with_name("java")
JAR_NAME = "tidemark-posix-fs.jar"
HADOOP_CONF = {
    # The FileSystem API: Spark's and Parquet's reads and writes.
    "spark.hadoop.fs.file.impl": "io.tidemark.fs.PosixLocalFileSystem",
    # The FileContext API: Delta's commits and Spark's checkpoint files.
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "io.tidemark.fs.PosixLocalFs",
}
JAVA_RELEASE = "17"
# Every entry gets the zip format's first date, so a build of the same sources by the
# same compiler is the same jar, byte for byte.
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def hadoop_api_jar() -> Path:
    """The Hadoop client API pyspark runs on: what the classes extend."""
    found = [jar for jar in _pyspark_jars() if jar.name.startswith("hadoop-client-api-")]
    if len(found) != 1:
        raise RuntimeError(f"expected one hadoop-client-api jar in pyspark's jars, found {found}")
    return found[0]


def build(target: Path) -> Path:
    """Compile :data:`SOURCES` into ``target/``:data:`JAR_NAME` (written whole, then renamed)."""
    javac = shutil.which("javac")
    if javac is None:
        raise RuntimeError("need javac, a Java 17 JDK: apt-get install openjdk-17-jdk-headless")
    sources = sorted(str(path) for path in SOURCES.rglob("*.java"))
    with tempfile.TemporaryDirectory(prefix="tidemark-javac-") as classes:
        command = [javac, "--release", JAVA_RELEASE, "-nowarn", "-cp", str(hadoop_api_jar()), "-d", classes]
        compiled = subprocess.run([*command, *sources], capture_output=True, text=True)
        if compiled.returncode != 0:
            raise RuntimeError(f"javac failed:\n{compiled.stdout}{compiled.stderr}")
        target.mkdir(parents=True, exist_ok=True)
        jar = target / JAR_NAME
        partial = jar.with_suffix(".partial")
        with zipfile.ZipFile(partial, "w") as archive:
            for path in sorted(Path(classes).rglob("*.class")):
                archive.writestr(
                    zipfile.ZipInfo(str(path.relative_to(classes)), ZIP_EPOCH), path.read_bytes()
                )
        partial.rename(jar)
    return jar


if __name__ == "__main__":
    print(f"tidemark: {build(posix_fs_dir())}")
