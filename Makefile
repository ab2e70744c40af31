# Tidemark: `make setup` once (idempotent), then `make test`.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
UV_INSTALL := $(VENV)/bin/uv pip install --quiet --python $(PY)
JARS_STAMP := $(VENV)/share/tidemark/jars/.resolved
KAFKA_STAMP := $(VENV)/share/tidemark/kafka/.resolved
TIDEMARK_JAR := $(VENV)/share/tidemark/tidemark-java/tidemark.jar
JVM_ARCHIVE := $(VENV)/share/tidemark/jvm/spark-classes.jsa
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: setup tools browser compose test test-fast lint format clean bench demo demo-s3 stop sql-server

# Quiet unless something fails: one line per resolved jar set and for the class archive.
setup: $(VENV)/.installed $(JARS_STAMP) $(KAFKA_STAMP) $(TIDEMARK_JAR) $(JVM_ARCHIVE)

$(VENV)/.installed: requirements.txt pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON)"; exit 1; }
	@command -v javac >/dev/null || { echo "need a Java 17 JDK (apt-get install openjdk-17-jdk-headless)"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# uv (pinned in requirements.txt) installs the pins faster than pip (docs/performance.md).
	@$(PY) -m pip install --quiet "$$(grep '^uv==' requirements.txt)"
	@$(UV_INSTALL) --compile-bytecode -r requirements.txt
	@$(UV_INSTALL) --no-deps -e . > $(VENV)/editable-install.log 2>&1 || { cat $(VENV)/editable-install.log; exit 1; }
	@touch $@

# Spark's jars (Delta, the Kafka connector, S3A) and the test broker's apart: under `make -j`
# (`make test`) the broker's resolve while the class archive builds.
$(JARS_STAMP): $(VENV)/.installed spark_jobs/jars.py
	@$(PY) -m spark_jobs.jars spark token-provider s3a
	@touch $@

$(KAFKA_STAMP): $(VENV)/.installed spark_jobs/jars.py
	@$(PY) -m spark_jobs.jars kafka
	@touch $@

# Tidemark's JVM classes (spark_jobs/java): Hadoop's local file system without its
# readlink and chmod processes, its Delta log store, and the landing zone's JSON-lines reader.
$(TIDEMARK_JAR): $(VENV)/.installed $(JARS_STAMP) spark_jobs/java_build.py $(wildcard spark_jobs/java/io/tidemark/*/*.java)
	@$(PY) -m spark_jobs.java_build

# The JVM classes a job loads, archived once (class-data sharing): every job starts faster.
$(JVM_ARCHIVE): $(JARS_STAMP) $(TIDEMARK_JAR) spark_jobs/jvm_archive.py spark_jobs/session.py
	@$(PY) -m spark_jobs.jvm_archive

# The commit-message rule (CONTRIBUTING.md) on the commits since the branch point.
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m tests.tools.commit_messages

format: $(VENV)/.installed
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# Debian's chromium drives the UI tests headless; its docker-compose validates docker-compose.yml
# without an engine; its PostgreSQL holds Airflow's metadata in the production rehearsal.
# Root installs whichever is missing in one apt-get; others are told how.
tools:
	@missing=""; \
	command -v chromium >/dev/null || command -v chromium-browser >/dev/null || missing="chromium"; \
	command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 || missing="$$missing docker-compose"; \
	command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else echo "need Debian's$$missing for the tests: sudo apt-get install$$missing"; exit 1; fi; \
	fi

browser compose: tools

# The Python environment and Debian's tools install side by side (on a fresh machine each
# waits on the network and the disk), the lint once the venv is in; then the tests.
# Two workers, a test file each at a time (its module fixtures start once); files go
# out in collection order (tests/conftest.py puts the longest first), not by test count.
# Most of the suite is CPU-bound Spark: a third worker on two cores only shares the same
# CPU out (docs/performance.md).
test:
	@$(MAKE) --no-print-directory -j3 setup tools lint
	$(VENV)/bin/pytest -n 2 --dist loadfile --no-loadscope-reorder

test-fast: setup
	$(VENV)/bin/pytest -m "not slow and not spark"

bench: setup
	PYTHONPATH=plugins $(PY) -m tests.benchmarks.bench $(BENCH_ARGS)

# The pipeline live under a real `airflow standalone` until `make stop` (Airflow's state in .tidemark/, the
# tables in ./lakehouse, every command's default).
demo: setup
	PYTHONPATH=plugins $(PY) -m tidemark_airflow.demo

# The same with the lakehouse on a SeaweedFS S3 server on loopback (its data in .tidemark/s3).
demo-s3: setup
	PYTHONPATH=plugins $(PY) -m tidemark_airflow.demo --object-store

stop:
	PYTHONPATH=plugins $(PY) -m tidemark_airflow.standalone stop

# Every Delta table over SQL on 127.0.0.1:$(SQL_PORT); query it with `.venv/bin/tidemark sql`.
SQL_PORT ?= 10000
sql-server: setup
	$(VENV)/bin/tidemark sql-server --port $(SQL_PORT)

clean:
	rm -rf $(VENV) lakehouse .pytest_cache .ruff_cache .hypothesis
