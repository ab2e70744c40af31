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

.PHONY: setup tools browser compose test test-fast lint format clean bench demo stop sql-server

# Quiet unless something fails: one line per resolved jar set and for the class archive.
setup: $(VENV)/.installed $(JARS_STAMP) $(KAFKA_STAMP) $(TIDEMARK_JAR) $(JVM_ARCHIVE)

$(VENV)/.installed: requirements.txt pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON)"; exit 1; }
	@command -v javac >/dev/null || { echo "need a Java 17 JDK (apt-get install openjdk-17-jdk-headless)"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# uv (pinned in requirements.txt) installs the pins in half pip's time (29.6 s against 54.7, empty caches).
	@$(PY) -m pip install --quiet "$$(grep '^uv==' requirements.txt)"
	@$(UV_INSTALL) --compile-bytecode -r requirements.txt
	@$(UV_INSTALL) --no-deps -e . > $(VENV)/editable-install.log 2>&1 || { cat $(VENV)/editable-install.log; exit 1; }
	@touch $@

# Spark's jars (Delta, the Kafka connector) and the test broker's apart: under `make -j`
# (`make test`) the broker's resolve while the class archive builds.
$(JARS_STAMP): $(VENV)/.installed spark_jobs/jars.py
	@$(PY) -m spark_jobs.jars spark token-provider
	@touch $@

$(KAFKA_STAMP): $(VENV)/.installed spark_jobs/jars.py
	@$(PY) -m spark_jobs.jars kafka
	@touch $@

# Tidemark's JVM classes (spark_jobs/java): Hadoop's local file system without its
# readlink and chmod processes, and the landing zone's JSON-lines reader.
$(TIDEMARK_JAR): $(VENV)/.installed spark_jobs/java_build.py $(wildcard spark_jobs/java/io/tidemark/*/*.java)
	@$(PY) -m spark_jobs.java_build

# The JVM classes a job loads, archived once (class-data sharing): every job starts faster.
$(JVM_ARCHIVE): $(JARS_STAMP) $(TIDEMARK_JAR) spark_jobs/jvm_archive.py spark_jobs/session.py
	@$(PY) -m spark_jobs.jvm_archive

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(VENV)/.installed
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# Debian's chromium drives the UI tests headless; its docker-compose validates docker-compose.yml
# without an engine. Root installs whichever is missing in one apt-get; others are told how.
tools:
	@missing=""; \
	command -v chromium >/dev/null || command -v chromium-browser >/dev/null || missing="chromium"; \
	command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 || missing="$$missing docker-compose"; \
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
# Session 66, 1,060 tests: 24.6 min (pytest 23:07; the workers' test wall 1,375 and 1,374 s)
# against 26.5 (24:58; 1,488 and 1,418) for stop 63 half an hour later. Measured 32.7 and 34.3 min, 1,058-1,059 tests (session 63, before and after the Kafka
# broker's short-jobs flags: the machine's noise); 32.3 and 33.5 min, 1,058 tests (session
# 62, after Hadoop's file: scheme stopped starting a readlink or chmod process per file;
# tests' CPU 2,819 -> 2,565 and 2,636 s); 35.0 min, 1,046 tests
# (session 61, after short-jobs' whole-heap start; 34.1 for the commit before it an hour
# earlier: the machine's noise); 32.8 min, 1,044 tests (session 60,
# after the session JVM's compiler and heap settings; 35.8 the day before); 37.2 and 39.9 min, 989-990 tests (session 51; vmstat: the
# cores 93 % busy on average). Earlier: 28.8 min, 926 tests, after bronze's typed fast path (32.0 an hour earlier; 40.2 with 911
# before it, with the tests' session JVM on the serial collector; 44.0 under G1, 45.0 in the session before; 38.5 with 888 at an earlier commit; 39.5 with 798 and the live demo's end-to-end test; 32.6 with 668 after
# silver's clocks moved into its history commit, 36.3 with 656 before it, 56.6 with 642
# before silver's windows became one overwrite; the machine's speed varies up to 2x within
# an hour: the same crash-point test took 300 and 589 s), against about 65 serial: most of
# the suite is CPU-bound Spark. A third worker does not help: with 983 tests, 28.4 min under
# -n 2, then 32.2 under -n 3 (beside a 7-minute benchmark), the cores 99.9 % busy throughout;
# session 64, both to the end on a quiet machine, same commit, 1,059 tests: -n 3 33.4 min
# (pytest 31:03) and 3,701 machine CPU-s, -n 2 34.0 (31:47) and 3,687 an hour later; each test
# took ~45 % longer beside two others, so the third worker only shares the same CPU out.
test:
	@$(MAKE) --no-print-directory -j3 setup tools lint
	$(VENV)/bin/pytest -n 2 --dist loadfile --no-loadscope-reorder

test-fast: setup
	$(VENV)/bin/pytest -m "not slow and not spark"

bench: setup
	$(PY) -m tests.benchmarks.bench

# The pipeline live under a real `airflow standalone` until `make stop` (Airflow's state in .tidemark/, the
# tables in ./lakehouse, every command's default).
demo: setup
	PYTHONPATH=plugins $(PY) -m tidemark_airflow.demo

stop:
	PYTHONPATH=plugins $(PY) -m tidemark_airflow.standalone stop

# Every Delta table over SQL on 127.0.0.1:$(SQL_PORT); query it with `.venv/bin/tidemark sql`.
SQL_PORT ?= 10000
sql-server: setup
	$(VENV)/bin/tidemark sql-server --port $(SQL_PORT)

clean:
	rm -rf $(VENV) lakehouse .pytest_cache .ruff_cache .hypothesis
