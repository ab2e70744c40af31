"""A racer of the log-store test: its own JVM, which writes versions 0..n-1 of a
log through a Delta log store, each at the same moment as the other racers (version
v at ``start + v * step``, plus up to ``jitter`` seconds at random), and records
which versions it won.

``python -m tests.integration.log_store_racer <log> <store class> <name> <versions> <step> <jitter> <out>``
(``<log>`` a URI; the start, in seconds since the epoch, in ``<out>.start`` once every racer is ready)."""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

from spark_jobs.jvm import java_class
from spark_jobs.session import build_session


def main(log: str, store_class: str, name: str, versions: int, step: float, jitter: float, out: Path) -> None:
    spark = build_session(
        f"tidemark-racer-{name}", master="local[1]", overrides={"spark.ui.enabled": "false"}
    )
    configuration = spark._jsc.hadoopConfiguration()
    store = java_class(spark, store_class)(configuration)
    hadoop_path = java_class(spark, "org.apache.hadoop.fs.Path")
    paths = [hadoop_path(f"{log}/{version:020d}.json") for version in range(versions)]
    lines = spark._jvm.java.util.ArrayList()
    lines.add(json.dumps({"writer": name}))
    won = []
    # A first write opens the file system (and on S3 checks the store's conditional
    # puts): done before the start, so that no racer begins behind the other.
    store.write(hadoop_path(f"{log}/../warm-up-{name}.json"), lines.iterator(), False, configuration)
    out.with_suffix(".ready").touch()
    while not out.with_suffix(".start").exists():
        time.sleep(0.01)
    start = float(out.with_suffix(".start").read_text())
    for version, path in enumerate(paths):
        moment = start + version * step + random.uniform(0, jitter)
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
    log, store_class, name, versions, step, jitter, out = sys.argv[1:]
    main(log, store_class, name, int(versions), float(step), float(jitter), Path(out))
