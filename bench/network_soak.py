"""The network-fault soak: many trials of the publish path under network faults, each checked by the history
checker.

    .stoker/venv/bin/python -m bench.network_soak [--trials 30] [--seed N]      (make soak)

On docker-compose.yaml's three-node KRaft cluster (RF 3, min.insync.replicas 2) started as local processes, with
each node's extra ``FAULTY`` listener behind the test's TCP proxy (tests/support/fault_proxy.py), every trial
publishes a fresh corpus with the real Spark stage while the proxy jitters, doubles and late-doubles the producers'
requests, holds back all traffic past the transaction timeout, and cuts every connection
(tests/support/network_trial.py). Kafka's own ConsoleConsumer reads the topic back under read_committed and
read_uncommitted; the checker (tests/support/history.py) names every anomaly. Results go to
``.stoker/network-soak/results.jsonl``; the table at the end is what BENCHMARKS.md records.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from typing import Any

from tests.support.fault_proxy import FaultProxy
from tests.support.fault_tools import soak_workspace, write_corpus
from tests.support.kafka_cluster import ComposeCluster
from tests.support.network_trial import TX_TIMEOUT_MS, network_trial


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    home, work, sample = soak_workspace("network-soak")
    corpus = write_corpus(work, sample, "network", docs_per_file=8_000, replication_factor=3, min_insync_replicas=2,
                          publish={"transaction_timeout_ms": TX_TIMEOUT_MS})
    cluster = ComposeCluster(home / "cluster", faulty=True)
    proxy = FaultProxy(cluster.proxy_routes, seed=args.seed)
    results: list[dict[str, Any]] = []
    t0 = time.time()
    try:
        cluster.start()
        proxy.start()
        for n in range(args.trials):
            r = network_trial(cluster, proxy, corpus, work / f"run{n}", f"stoker.network.20261201.a{n + 1}",
                              random.Random(rng.randrange(1 << 30)))
            r.pop("log_tail") if r["published"] else None
            results.append(r)
            print(json.dumps(r), flush=True)
            with open(home / "results.jsonl", "a") as f:
                f.write(json.dumps(r) + "\n")
    finally:
        proxy.stop()
        cluster.stop()
    bad = [r for r in results if r["anomalies"]]
    total = Counter[str]()
    for r in results:
        total.update(r["anomalies"])
    held = [float(f.split()[1].rstrip("s")) for r in results for f in r["faults"] if f.startswith("hold")]
    print(f"\nnetwork soak (seed {args.seed}): {len(results)} trials in {time.time() - t0:.0f} s, transaction timeout "
          f"{TX_TIMEOUT_MS / 1000:.0f} s")
    print(f"published {sum(r['published'] for r in results)}, failed {sum(not r['published'] for r in results)}; "
          f"sequences {sum(r['sequences'] or 0 for r in results)}; Spark task retries "
          f"{sum(r['task_failures'] for r in results)}")
    print(f"faults: requests {sum(r['proxy']['requests'] for r in results)}, doubled "
          f"{sum(r['proxy']['duplicated'] for r in results)}, late copies {sum(r['proxy']['late'] for r in results)}, "
          f"cuts {sum(r['proxy']['cuts'] for r in results)}, holds past the timeout "
          f"{sum(h > TX_TIMEOUT_MS / 1000 for h in held)} (longest {max(held, default=0):.1f} s)")
    print("every trial: 0 anomalies" if not bad else f"ANOMALIES {dict(total)} in trials {bad}")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
