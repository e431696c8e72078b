# Stoker — the two commands a newcomer needs: `make run` and `make test`.
# Both run `make setup` first; it is idempotent and a no-op in seconds when nothing changed.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PY        ?= python3
STATE     := $(CURDIR)/.stoker
VENV      := $(STATE)/venv
BIN       := $(VENV)/bin
CACHE     ?= $(HOME)/.cache/stoker
# Versions have one owner each, in the code that runs them; the Makefile reads them from there.
pyconst = $(shell sed -n 's/^$(1) = "\(.*\)".*/\1/p' $(2))
KAFKA_VER := $(call pyconst,KAFKA_VERSION,stoker_local/broker/__init__.py)
KAFKA_DIR := $(CACHE)/kafka-$(KAFKA_VER)
# Hadoop: the version pyspark ships; S3A's jars and the test HDFS follow it (stoker/stores/connectors)
HADOOP_VER := $(call pyconst,HADOOP_VERSION,stoker/stores/connectors/__init__.py)
S3A_DIR   := $(CACHE)/s3a-$(HADOOP_VER)
HDFS_DIR  := $(CACHE)/hdfs-$(HADOOP_VER)
SEAWEEDFS_VER := $(call pyconst,SEAWEEDFS_VERSION,stoker_local/servers/__init__.py)
SEAWEEDFS_BIN := $(CACHE)/seaweedfs-$(SEAWEEDFS_VER:v0.0.0-%=%)/weed
UV_VER    := 0.13.9
PYTEST_ARGS ?=

export STOKER_HOME := $(STATE)
export STOKER_CACHE := $(CACHE)
export PATH := $(BIN):$(PATH)
export HF_HUB_OFFLINE := 1
export SPARK_LOCAL_IP := 127.0.0.1
export PYSPARK_PYTHON := $(BIN)/python

.PHONY: versions help setup check-tools stack-deps hosts-deps browser-deps venv kafka-jars s3a-jars test-servers sample run test test-unit test-quick docs lint bench bench-gate bench-schedule bench-replay bench-replay-memory bench-quality soak up down clean

help:
	@echo "make run    set up, start Kafka and PostgreSQL (Airflow's database, shared with make up), run refresh_sample end to end, print the run summary"
	@echo "make test   set up, then the whole test suite (unit, integration, DAG)"
	@echo "make test-quick  the unit tests only (no service started, under two minutes)"
	@echo "make docs   regenerate docs/config.md (the configuration reference) and docs/development.md's code map from the code"
	@echo "make bench  debug_cpu model step vs its earlier shape; Spark tokenisation vs raw encode_batch; Kafka token source vs numpy memmap; folder vs S3 vs HDFS;"
	@echo "            the publish step vs Kafka's ProducerPerformance; a 2.8 GB generated corpus (a 2.2 GB file,"
	@echo "            many small, .zst, Parquet) through tokenize_publish at default settings (~40 min);"
	@echo "            and the gate's and the LR schedules' benches below (~90 min)"
	@echo "make bench-gate      ten trials of sabotaged nights against the promotion gate"
	@echo "make bench-schedule  three nights of a line per LR schedule (rewarm, constant, wsd)"
	@echo "make bench-replay    forgetting with train.replay 0, 0.05, 0.25 (docstrings, then CJK)"
	@echo "make bench-replay-memory  replay's peak memory, worker and rank, at 1 M sequences of 4,096 tokens"
	@echo "make bench-quality   the quality filters against datatrove's on 10,000 mixed documents: agreement, docs/s;"
	@echo "                     the whole stage with them and near-dedup against datatrove's executor: docs/s per core, memory"
	@echo "make soak   kill -9 workers, jobs, brokers, trainers at random points on a 3-node cluster; count lost"
	@echo "            and duplicated sequences with Kafka's own reader (TRIALS=12, ~15 min); first the line lease's"
	@echo "            and the line ledger's state machines through many more random histories (STATE_EXAMPLES=5000)"
	@echo "            then the publish path through network faults (delays, doubled and late requests, holds past the"
	@echo "            transaction timeout, cuts), each history checked for anomalies (NETWORK_TRIALS=30, ~45 min)"
	@echo "make up     the local stack: Kafka, PostgreSQL, Airflow api-server/scheduler/dag-processor/triggerer"
	@echo "make down   stop exactly what make up started"
	@echo "make lint   ruff + mypy on the core"
	@echo "make clean  stop the embedded broker and remove .stoker/ (run state)"

setup: check-tools venv kafka-jars s3a-jars sample

versions:  # what the Makefile builds, as read from the code (tests/unit/test_sources.py checks they agree)
	@echo "KAFKA_VER=$(KAFKA_VER) HADOOP_VER=$(HADOOP_VER) SEAWEEDFS_VER=$(SEAWEEDFS_VER)"

check-tools:
	@command -v java >/dev/null || { echo "setup: java not found: install a JDK 17+ (Debian: apt-get install openjdk-17-jdk-headless)"; exit 1; }
	@java -version 2>&1 | grep -Eq 'version "(1[7-9]|[2-9][0-9])' || { echo "setup: Java 17+ is required, found: $$(java -version 2>&1 | head -1)"; exit 1; }
	@command -v mvn >/dev/null || { echo "setup: mvn not found: install Maven (Debian: apt-get install maven)"; exit 1; }
	@command -v $(PY) >/dev/null || { echo "setup: $(PY) not found: install Python 3.11"; exit 1; }

# Debian packages the stack needs: PostgreSQL (Airflow's metadata DB for `make up`), Redis for the
# multi-host test and, for the browser test, Chromium (driven by Playwright through executable_path; no browser is ever downloaded).
# Installed with apt-get when run as root; otherwise a clear message says what to install.
APT_INSTALL = if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "setup: installing $(1) with apt-get"; \
	  { apt-get install -y -q --no-install-recommends $(1) >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(1) >/dev/null; }; }; \
	else echo "setup: $(2) not found: install it (Debian: sudo apt-get install $(1))"; exit 1; fi

stack-deps:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || { $(call APT_INSTALL,postgresql,PostgreSQL's initdb); }

# The multi-host test (tests/distributed): Redis as the CeleryExecutor's broker; unshare(1) (util-linux)
# makes each simulated host's namespaces.
hosts-deps:
	@command -v redis-server >/dev/null || { $(call APT_INSTALL,redis-server,redis-server); }
	@command -v unshare >/dev/null || { $(call APT_INSTALL,util-linux,unshare); }

browser-deps:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || [ -n "$$STOKER_CHROMIUM" ] || { $(call APT_INSTALL,chromium,chromium); }

# The venv is rebuilt only when requirements.lock or pyproject.toml change (their hash is the stamp).
venv: $(VENV)/.stamp
$(VENV)/.stamp: requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@test -x $(BIN)/uv && $(BIN)/uv --version | grep -q $(UV_VER) || $(BIN)/pip install -q uv==$(UV_VER)
	$(BIN)/uv pip install --python $(BIN)/python -q -r requirements.lock
	$(BIN)/uv pip install --python $(BIN)/python -q --no-deps -e .
	@touch $@

# Apache Kafka's jars from Maven Central, cached per user (they do not depend on the checkout).
kafka-jars: $(KAFKA_DIR)/.complete
$(KAFKA_DIR)/.complete: stoker_local/broker/pom.xml
	@mkdir -p $(KAFKA_DIR)
	mvn -q -B -f stoker_local/broker/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
	    -DoutputDirectory=$(KAFKA_DIR)/libs
	@test -n "$$(ls $(KAFKA_DIR)/libs/kafka_2.13-$(KAFKA_VER).jar)"
	@touch $@

# The S3A connector (hadoop-aws + the AWS SDK's S3 modules) for s3:// sources, per user.
s3a-jars: $(S3A_DIR)/.complete
$(S3A_DIR)/.complete: stoker/stores/connectors/pom.xml
	@rm -rf $(S3A_DIR) && mkdir -p $(S3A_DIR)
	mvn -q -B -f stoker/stores/connectors/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
	    -DoutputDirectory=$(S3A_DIR)/jars
	@test -n "$$(ls $(S3A_DIR)/jars/hadoop-aws-$(HADOOP_VER).jar)"
	@touch $@

# Real storage servers for the tests (and `stoker storage up`): SeaweedFS's S3 gateway built from
# the Go module proxy, and Hadoop's NameNode + DataNode (the mini cluster) from Maven Central.
test-servers: $(SEAWEEDFS_BIN) $(HDFS_DIR)/.complete
$(SEAWEEDFS_BIN):  # the version is in the path: only a new version builds again
	@command -v go >/dev/null || { echo "setup: go not found: install Go 1.26+ (Debian: apt-get install golang-go); it builds SeaweedFS, the tests' S3 server"; exit 1; }
	bash stoker_local/servers/build-seaweedfs.sh $(SEAWEEDFS_VER) $@
$(HDFS_DIR)/.complete: stoker_local/servers/hdfs/pom.xml
	@rm -rf $(HDFS_DIR) && mkdir -p $(HDFS_DIR)
	mvn -q -B -f stoker_local/servers/hdfs/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
	    -DoutputDirectory=$(HDFS_DIR)/libs
	@touch $@

sample: $(STATE)/data/sample/_SUCCESS
$(STATE)/data/sample/_SUCCESS: stoker_local/sample.py | venv
	$(BIN)/stoker sample-corpus --force

run: setup stack-deps
	$(BIN)/stoker refresh sample --ds $${DS:-$$(date -u +%F)}

test: setup stack-deps hosts-deps browser-deps test-servers
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

test-unit: setup
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

# the unit tests alone, no service started (under two minutes: the state machines through 200 histories each,
# not make test's 1000); needs the venv only
test-quick: venv
	STOKER_STATE_EXAMPLES=$${STATE_EXAMPLES:-200} $(BIN)/python -m pytest tests/unit -q $(PYTEST_ARGS)

# docs/config.md from the config dataclasses' docstrings, and docs/development.md's code map from the module
# docstrings (a unit test fails when either drifts)
docs: venv
	$(BIN)/python -m stoker.config.reference
	$(BIN)/python -m stoker_local.codemap

lint: venv
	$(BIN)/ruff check stoker stoker_local spark_jobs plugins dags training tests bench
	$(BIN)/mypy

bench: setup test-servers
	$(BIN)/python -m bench.model_step_bench
	$(BIN)/python -m bench.tokenize_bench
	$(BIN)/python -m bench.pack_parts_bench
	$(BIN)/python -m bench.quality_bench
	$(BIN)/python -m bench.quality_stage_bench
	$(BIN)/python -m bench.source_bench
	$(BIN)/python -m bench.store_bench
	$(BIN)/python -m bench.publish_bench
	$(BIN)/python -m bench.scale_bench --shape mixed
	$(BIN)/python -m bench.sabotage_bench --trials 10
	$(BIN)/python -m bench.schedule_bench
	$(BIN)/python -m bench.replay_bench

# three nights of a line per LR schedule (rewarm, constant, wsd) on the same data (about 12 min)
bench-schedule: setup
	$(BIN)/python -m bench.schedule_bench

# forgetting with train.replay 0, 0.05 and 0.25: two nights each, docstrings then CJK (about 10 min)
bench-replay: setup
	$(BIN)/python -m bench.replay_bench

# replay's peak memory at 1 M sequences of 4,096 tokens, replay 0.05: the worker's draw and a rank (8 GB topic)
bench-replay-memory: setup
	$(BIN)/python -m bench.replay_memory_bench

bench-quality: setup
	$(BIN)/python -m bench.quality_bench
	$(BIN)/python -m bench.quality_stage_bench

# the promotion gate against sabotaged nights alone, through the DAG: 10 trials (about 5 min each)
bench-gate: setup
	$(BIN)/python -m bench.sabotage_bench --trials 10

# hard faults at random points on a 3-node cluster, many trials (~1 min each); TRIALS=12 by default;
# then network faults on the publish path (~1.5 min each); NETWORK_TRIALS=30 by default
soak: setup
	STOKER_STATE_EXAMPLES=$${STATE_EXAMPLES:-5000} $(BIN)/python -m pytest -q tests/unit/test_line_lease_states.py \
		tests/unit/test_line_ledger_states.py
	$(BIN)/python -m bench.soak --trials $${TRIALS:-12}
	$(BIN)/python -m bench.network_soak --trials $${NETWORK_TRIALS:-30}

up: setup stack-deps
	$(BIN)/stoker up

down:
	@test -x $(BIN)/stoker || { echo "down: nothing to stop (no $(BIN)/stoker)"; exit 0; }; $(BIN)/stoker down

clean:
	-$(BIN)/stoker down
	-$(BIN)/stoker kafka down
	rm -rf $(STATE)
