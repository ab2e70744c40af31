"""Tidemark's own JVM classes (``spark_jobs/java``), compiled once at setup.

``python -m spark_jobs.java_build`` (run by ``make setup``) compiles them against
pyspark's own jars (Spark, Hadoop, Jackson) and Delta's into
:func:`spark_jobs.jars.tidemark_jar_dir`, which :func:`spark_jobs.jars.local_jars`
puts on every session's class path: the local file system without shell-outs and
its Delta log store (``spark_jobs.posix_fs``), and the landing zone's JSON-lines
reader (``spark_jobs.sources.files``).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from spark_jobs.jars import _pyspark_jars, jars_dir, tidemark_jar_dir

SOURCES = Path(__file__).with_name("java")
JAR_NAME = "tidemark.jar"
JAVA_RELEASE = "17"
# Every entry gets the zip format's first date, so a build of the same sources by the
# same compiler is the same jar, byte for byte.
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def class_path() -> str:
    """The jars pyspark runs on and Delta's: what the classes extend and call."""
    jars = _pyspark_jars()
    if not jars:
        raise RuntimeError("pyspark's jars are missing: reinstall pyspark")
    delta = sorted(jars_dir().glob("io.delta_delta-*.jar"))
    if not delta:
        raise RuntimeError(f"Delta's jars are missing from {jars_dir()}: run `make setup`")
    return ":".join(str(jar) for jar in [*jars, *delta])


def build(target: Path) -> Path:
    """Compile :data:`SOURCES` into ``target/``:data:`JAR_NAME` (written whole, then renamed)."""
    javac = shutil.which("javac")
    if javac is None:
        raise RuntimeError("need javac, a Java 17 JDK: apt-get install openjdk-17-jdk-headless")
    sources = sorted(str(path) for path in SOURCES.rglob("*.java"))
    with tempfile.TemporaryDirectory(prefix="tidemark-javac-") as classes:
        command = [javac, "--release", JAVA_RELEASE, "-nowarn", "-cp", class_path(), "-d", classes]
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
    print(f"tidemark: {build(tidemark_jar_dir())}")
