"""One trial of the publish path under network faults (tests/faults/test_network_faults.py runs a few, ``make soak``
many): the Spark stage publishes to the 3-node cluster through :class:`~tests.support.fault_proxy.FaultProxy`,
which delays and duplicates its requests, holds back all traffic for longer than the transaction timeout and cuts
every connection, at random moments of the publish. Then the history checker (tests/support/history.py) reads the
topic back with Kafka's own tools.

A trial passes when the history has no anomaly and the run either published exactly what its manifest says or
failed with no manifest: a fault may fail a night (Spark's retries used up), never make it wrong.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

from tests.support.fault_proxy import FaultProxy
from tests.support.fault_tools import await_publishing, job_log, submit
from tests.support.history import anomalies, check_publish
from tests.support.kafka_cluster import ComposeCluster

TX_TIMEOUT_MS = 10_000
"""The trial corpus's ``publish.transaction_timeout_ms``: short, so that a hold outlasts it in seconds."""


def _faults(proxy: FaultProxy, rng: random.Random, done: threading.Event, log: list[str]) -> None:
    """Faults at random moments, until the job ends: jittered, doubled and late-doubled requests all along, one
    hold past the transaction timeout, then a cut and a short hold in a random order."""
    delay, dup, late = rng.choice([5.0, 30.0, 150.0]), rng.choice([0.0, 0.05, 0.2]), rng.choice([0.1, 0.3])
    late_s = rng.uniform(1.0, TX_TIMEOUT_MS / 1000 * 1.5)
    proxy.set(delay_ms=delay, duplicate=dup, late=late, late_s=late_s)
    log.append(f"delay<={delay:.0f}ms duplicate={dup} late={late} after {late_s:.1f}s")
    rest = ["cut", "short hold"]
    rng.shuffle(rest)
    for step in ["long hold", *rest]:  # the long hold first, while the publish surely runs
        if done.wait(rng.uniform(0.2, 2.0)):
            return
        if step == "long hold":
            seconds = TX_TIMEOUT_MS / 1000 + rng.uniform(1.0, 5.0)
            log.append(f"hold {seconds:.1f}s")
            proxy.hold(seconds)
        elif step == "short hold":
            seconds = rng.uniform(0.5, 3.0)
            log.append(f"hold {seconds:.1f}s")
            proxy.hold(seconds)
        else:
            log.append("cut")
            proxy.cut()


def network_trial(cluster: ComposeCluster, proxy: FaultProxy, corpus: Path, run_dir: Path, topic: str,
                  rng: random.Random) -> dict[str, Any]:
    """Publish ``corpus`` through ``proxy`` with faults; the outcome, the faults and the anomalies found."""
    from stoker.layout import RunLayout
    from stoker.run.manifest import read_manifest

    t0 = time.monotonic()
    proxy.reset()
    proc = submit(corpus, topic, run_dir, cluster.faulty_client)
    done, log = threading.Event(), []
    faults = threading.Thread(target=_faults, args=(proxy, rng, done, log), daemon=True)
    try:
        await_publishing(cluster.client, topic, proc, run_dir=run_dir)
        faults.start()
        rc = proc.wait(timeout=1200)
    finally:
        done.set()
        if proc.poll() is None:
            proc.kill()
        if faults.is_alive():
            faults.join(30)
        proxy.set()
    manifest = read_manifest(run_dir) if RunLayout(run_dir).manifest.is_file() else None
    found = check_publish(cluster.client["bootstrap.servers"], topic, manifest)
    if manifest is None:  # a failed night: what it committed must still be right, though it need not be whole
        found["lost"], found["counts"] = [], []
    lines = job_log(run_dir).read_text(errors="replace").splitlines()
    tail = "\n".join(ln for ln in lines if not ln.startswith("%"))[-3000:]
    return {"rc": rc, "published": manifest is not None, "sequences": manifest.sequences if manifest else None,
            "faults": log, "anomalies": anomalies(found),
            "task_failures": sum("Lost task" in ln for ln in lines),  # Spark's retries of a failed publish task
            "examples": {k: v[:3] for k, v in found.items() if v},
            "proxy": {"requests": proxy.stats.requests, "duplicated": proxy.stats.duplicated, "late": proxy.stats.late,
                      "connections": proxy.stats.connections, "cuts": proxy.stats.cuts},
            "seconds": round(time.monotonic() - t0, 1), "log_tail": tail if rc != 0 or manifest is None else ""}
