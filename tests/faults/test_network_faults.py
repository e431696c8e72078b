"""The publish path under network faults, not process kills: the Spark stage's producers reach docker-compose.yaml's
3-node cluster only through a proxy the test steers (tests/support/fault_proxy.py), which jitters and doubles
their requests, holds back all traffic for longer than the transaction timeout, and cuts every connection, at
random moments of the publish (tests/support/network_trial.py). A history checker reads the topic back with Kafka's
own ConsoleConsumer under read_committed and read_uncommitted and names every anomaly (tests/support/history.py).

A few trials here; ``make soak`` runs many (BENCHMARKS.md). Each must end with 0 anomalies, and with the manifest
published exactly or the night failed clearly."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from tests.support.fault_proxy import FaultProxy
from tests.support.fault_tools import write_corpus
from tests.support.kafka_cluster import ComposeCluster
from tests.support.network_trial import TX_TIMEOUT_MS, network_trial

pytestmark = pytest.mark.faults
HOME = Path(os.environ["STOKER_HOME"]) / "faults-network"
TRIALS = 2


@pytest.fixture(scope="module")
def faulty_cluster():
    c = ComposeCluster(HOME, faulty=True)
    proxy = FaultProxy(c.proxy_routes, seed=random.randrange(1 << 30))
    try:
        c.start()
        proxy.start()
        yield c, proxy
    finally:
        proxy.stop()
        c.stop()


@pytest.mark.parametrize("trial", range(TRIALS))
def test_publish_through_delays_duplicates_holds_and_cuts_has_no_anomaly(faulty_cluster, sample_corpus, tmp_path,
                                                                         trial):
    cluster, proxy = faulty_cluster
    corpus = write_corpus(tmp_path, sample_corpus, "network", docs_per_file=8_000, replication_factor=3,
                          min_insync_replicas=2, publish={"transaction_timeout_ms": TX_TIMEOUT_MS})
    seed = random.randrange(1 << 30)
    out = network_trial(cluster, proxy, corpus, tmp_path / "run", f"stoker.network.20261201.a{trial + 1}",
                        random.Random(seed))
    print(f"trial {trial} (seed {seed}): {out}")
    assert out["anomalies"] == {}, out
    assert out["proxy"]["requests"] > 0 and out["faults"], out  # the traffic went through the faults
    if out["published"]:
        assert out["rc"] == 0 and out["sequences"] > 0, out
    else:  # failed, and said why: Spark's last task error
        assert out["rc"] != 0 and "Error" in out["log_tail"], out
