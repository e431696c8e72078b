"""The embedded broker's life cycle, and the Spark install that every Arrow UDF depends on."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from stoker.exceptions import StackError
from stoker.kafka import topics as ktopics
from stoker_local import broker as stack
from stoker_local.servers import free_ports

pytestmark = pytest.mark.integration


def test_broker_up_is_idempotent_and_down_stops_exactly_it(tmp_path):
    # a port nothing uses now: a fixed one inside the ephemeral range (32768-60999) can be taken for a
    # moment by any client socket of the suite, and the broker's bind then fails
    port = free_ports(2)
    broker = stack.Broker(home=tmp_path / "kafka", port=port)
    stack.up(broker)
    try:
        pid = stack.status(broker)["pid"]
        assert pid and stack.status(broker)["running"]
        assert stack.up(broker) == broker and stack.status(broker)["pid"] == pid  # no second broker
        assert ktopics.check_reachable(broker.client_config()) == 1
        # a second stack on the same port refuses clearly instead of fighting over it
        with pytest.raises(StackError, match=f"port {port} is in use"):
            stack.up(stack.Broker(home=tmp_path / "other", port=port))
    finally:
        assert stack.down(broker) is True
    assert not stack.status(broker)["running"]
    assert not (tmp_path / "kafka" / "broker.pid").exists()
    assert not _is_kafka(pid)  # the process (and its group) is gone, not just the pid file
    assert stack.down(broker) is False


def _is_kafka(pid: int) -> bool:
    try:
        return b"kafka.Kafka" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def test_cli_status_reports_json(tmp_path):
    env = {"STOKER_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "stoker_local.cli", "kafka", "status"], env=env,
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["running"] is False


def test_pyspark_and_its_client_agree_and_arrow_udfs_work(spark):
    # pyspark-client (pulled by the Spark provider) overwrites pyspark's files when versions differ
    assert version("pyspark") == version("pyspark-client")

    def double(batches):
        import pyarrow as pa

        for b in batches:
            yield pa.RecordBatch.from_pydict({"x": [v * 2 for v in b.column(0).to_pylist()]})

    rows = spark.range(100).mapInArrow(double, "x long").collect()
    assert sorted(r.x for r in rows) == [2 * i for i in range(100)]


def test_storage_formats_with_a_cluster_id_that_starts_with_a_dash(tmp_path):
    """One random id in 64 starts with '-' (base64url): the format command must not read it as an option
    (it did, and failed CI once)."""
    b = stack.Broker(home=tmp_path / "kafka", port=29792)
    b.home.mkdir()
    b.config_file.write_text(stack._server_properties(b))
    stack._format_storage(b, cluster_id="-AbCdEfGhIjKlMnOpQrStU")
    assert "cluster.id=-AbCdEfGhIjKlMnOpQrStU" in (b.home / "data" / "meta.properties").read_text()
