"""Shared fixtures. The suite starts what it needs itself:

* a real Apache Kafka broker (KRaft, from the jars `make setup` resolved), unless
  ``STOKER_KAFKA_BOOTSTRAP`` names a cluster to use instead;
* Spark in local mode (``local[2,4]``: two cores, up to four attempts per task);
* an Airflow home with its own SQLite metadata DB;
* S3 (SeaweedFS) and HDFS (Hadoop's NameNode + DataNode) servers on 127.0.0.1, for the
  object-store tests (stoker_local/servers, built by `make test-servers`).

All test state lives in ``.stoker/test`` (git-ignored), apart from the user's runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# `make test` runs the suite's files on two xdist workers (gw0, gw1). Each is a session of its own: its own
# state folder, broker port and Airflow home, so neither sees the other's runs, lines or DAG runs.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
TEST_STATE = Path(os.environ.get("STOKER_TEST_HOME", REPO / ".stoker" / "test")) / WORKER
TEST_KAFKA_PORT = 29192 + 4 * int(WORKER.removeprefix("gw") or 0)  # the broker takes port, port + 1 and port + 2

os.environ["STOKER_HOME"] = str(TEST_STATE)
os.environ["STOKER_PROJECT"] = str(REPO)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
_BOOTSTRAP = os.environ.get("STOKER_KAFKA_BOOTSTRAP") or f"127.0.0.1:{TEST_KAFKA_PORT}"

from stoker_local.airflow_env import airflow_env  # noqa: E402

# airflow_env keeps what the environment already holds. An xdist worker inherits its controller's
# environment, which this module set up for the controller's paths: drop those keys, keep the user's own.
for _key in filter(None, os.environ.pop("STOKER_TEST_ENV_KEYS", "").split(",")):
    os.environ.pop(_key, None)
_ENV = airflow_env(_BOOTSTRAP)
os.environ["STOKER_TEST_ENV_KEYS"] = ",".join(k for k in _ENV if k not in os.environ)
os.environ.update(_ENV)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Runs and model lines start empty in a session that runs more than unit tests: a second `make test`
    must not find the first's lines (a night of a line that already has it is planned as a branch, not as
    the line's first night). A unit-only session (`make test-unit`, beside a running suite) leaves them."""
    if any(item.get_closest_marker("unit") is None for item in items):
        for left_over in ("runs", "lines"):
            shutil.rmtree(TEST_STATE / left_over, ignore_errors=True)
    # The longest files first, so that `make test`'s two workers (xdist, one file at a time each, in this
    # order: --dist loadfile --no-loadscope-reorder) end together instead of one waiting out the stack's tests.
    items.sort(key=lambda item: _rank(item.nodeid.partition("::")[0]))


SLOWEST_FILES = (
    "tests/stack/test_operations.py", "tests/e2e/test_dags.py", "tests/faults/test_cluster_kills.py",
    "tests/e2e/test_sabotage.py", "tests/distributed/test_celery_hosts.py", "tests/faults/test_spark_kills.py",
)
"""Files measured at 4-20 minutes each (BENCHMARKS.md, the suite's time), the longest first."""


def _rank(path: str) -> int:
    return SLOWEST_FILES.index(path) if path in SLOWEST_FILES else len(SLOWEST_FILES)


@pytest.fixture(scope="session")
def kafka_config() -> dict[str, str]:
    """A reachable Kafka cluster's client config; starts the embedded broker when none is given."""
    from stoker.kafka import topics as ktopics
    from stoker_local import broker as stack

    if os.environ.get("STOKER_KAFKA_BOOTSTRAP"):
        config = {"bootstrap.servers": os.environ["STOKER_KAFKA_BOOTSTRAP"]}
        ktopics.check_reachable(config)
        yield config
        return
    broker = stack.Broker(home=TEST_STATE / "kafka", port=TEST_KAFKA_PORT)
    stack.up(broker)
    try:
        yield broker.client_config()
    finally:
        stack.down(broker)


@pytest.fixture(scope="session")
def secure_kafka() -> dict[str, str]:
    """A second embedded broker serving only SASL_SSL (`stoker kafka up --secure`): its client config."""

    from stoker_local import broker as stack
    from stoker_local.servers import free_ports

    home = TEST_STATE / "kafka-secure"
    shutil.rmtree(home, ignore_errors=True)  # a fresh CA and password every session
    broker = stack.Broker(home=home, port=free_ports(3), secure=True)
    stack.up(broker)
    try:
        yield broker.client_config()
    finally:
        stack.down(broker)


@pytest.fixture(scope="session")
def sample_corpus() -> dict[str, Path]:
    """The sample corpus and its tokenizer, made offline (once per test state folder)."""
    from stoker_local import sample

    data = TEST_STATE / "data" / "sample"
    tok_dir = TEST_STATE / "tokenizers" / "sample-bpe-8192"
    if not (data / "_SUCCESS").exists() or not (tok_dir / "tokenizer.json").exists():
        sample.write_corpus(data)
        sample.train_tokenizer(data, tok_dir)
    return {"data": data, "tokenizer": tok_dir / "tokenizer.json"}


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """A migrated Airflow metadata DB in the test Airflow home."""
    home = Path(os.environ["AIRFLOW_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, stdout=subprocess.DEVNULL,
                   env=os.environ.copy())
    return home


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    from stoker.stores.connectors import s3a_jars

    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (SparkSession.builder.master("local[2,4]").appName("stoker-tests")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
               .config("spark.sql.execution.arrow.maxRecordsPerBatch", "64")
               .config("spark.jars", ",".join(map(str, s3a_jars())))  # s3:// sources (S3A), as `make setup` left it
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def seaweed():
    """A real S3-compatible server (SeaweedFS) with a bucket named ``corpora``."""

    from stoker_local.servers import SeaweedS3

    home = TEST_STATE / "seaweedfs"
    SeaweedS3(home).stop()  # one an interrupted earlier session left running, if any
    shutil.rmtree(home, ignore_errors=True)
    with SeaweedS3(home) as server:
        server.create_bucket("corpora")
        yield server


@pytest.fixture(scope="session")
def hdfs():
    """A real HDFS: Hadoop's NameNode and one DataNode (the mini cluster)."""

    from stoker_local.servers import MiniHdfs

    home = TEST_STATE / "hdfs"
    MiniHdfs(home).stop()
    shutil.rmtree(home, ignore_errors=True)
    with MiniHdfs(home) as server:
        yield server
