"""A racer of the log-store test: its own JVM, which writes versions 0..n-1 of a
log through a Delta log store, each at the same moment as the other racers (version
v at ``start + v * step``), and records which versions it won.

``python -m tests.integration.log_store_racer <log> <store class> <name> <versions> <start> <step> <out>``
(``start`` in seconds since the epoch)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from spark_jobs.jvm import java_class
from spark_jobs.session import build_session


def main(log: str, store_class: str, name: str, versions: int, step: float, out: Path) -> None:
    spark = build_session(
        f"tidemark-racer-{name}", master="local[1]", overrides={"spark.ui.enabled": "false"}
    )
    configuration = spark._jsc.hadoopConfiguration()
    store = java_class(spark, store_class)(configuration)
    hadoop_path = java_class(spark, "org.apache.hadoop.fs.Path")
    paths = [hadoop_path(f"file:{log}/{version:020d}.json") for version in range(versions)]
    lines = spark._jvm.java.util.ArrayList()
    lines.add(json.dumps({"writer": name}))
    won = []
    out.with_suffix(".ready").touch()
    while not out.with_suffix(".start").exists():
        time.sleep(0.01)
    start = float(out.with_suffix(".start").read_text())
    for version, path in enumerate(paths):
        moment = start + version * step
        while time.time() < moment:
            pass
        try:
            store.write(path, lines.iterator(), False, configuration)
            won.append(version)
        except Exception as error:  # py4j's error for the FileAlreadyExistsException a loser gets
            if "FileAlreadyExistsException" not in str(error):
                raise
    out.write_text(json.dumps(won))
    spark.stop()


if __name__ == "__main__":
    log, store_class, name, versions, step, out = sys.argv[1:]
    main(log, store_class, name, int(versions), float(step), Path(out))
