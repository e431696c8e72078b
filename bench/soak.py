"""The fault soak: many trials of hard faults at random points, each counted by an independent reader.

    .stoker/venv/bin/python -m bench.soak [--trials 12] [--seed N]      (make soak)

On docker-compose.yaml's three-node KRaft cluster (RF 3, min.insync.replicas 2), started here as
local processes, every trial publishes a fresh ~24 MB corpus with the real Spark stage
(``spark-submit spark_jobs/tokenize_publish.py``) or trains on a published run with the real
trainer, and kills something with SIGKILL at a random moment:

* ``worker``: one forked PySpark worker (a task mid-transaction); Spark retries the task;
* ``job``: the whole spark-submit (driver, JVM, workers); the job is run again on the same topic;
* ``committed``: a task's worker right after its commit, so its result never reaches the driver;
* ``leader``: the broker leading a random partition of the run topic;
* ``coordinator``: the broker coordinating a random task's transaction;
* ``trainer``: the whole trainer (launcher and ranks) at a random step; it is launched again and
  resumes from its checkpoint.

Outcomes come from Kafka's own ConsoleConsumer (read_committed) against the manifest, and for
training from the trainer's keys audit log: lost = sequences of the manifest never seen,
duplicated = sequences seen more than once. A job that fails outright (as Airflow would see it) is
run again under the next attempt's topic and counted as ``retried``. Results go to
``.stoker/soak/results.jsonl``; the table at the end is what BENCHMARKS.md records.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from stoker.layout import RunLayout, TrainerFiles, complete_checkpoints
from stoker.run import records
from stoker.run.manifest import read_manifest
from tests.support.fault_tools import await_publishing, soak_workspace, submit, write_corpus
from tests.support.kafka_cluster import ComposeCluster
from tests.support.trainer_tools import (
    await_step,
    committed_keys,
    keys_by_step,
    kill_tree,
    launch_trainer,
    publish_run,
)

PUBLISH_FAULTS = ("worker", "job", "committed", "leader", "coordinator")
FAULTS = (*PUBLISH_FAULTS, "trainer")


def _daemon_workers(pid: int) -> list[psutil.Process]:
    def daemon(p: psutil.Process) -> bool:
        try:
            return p.status() != psutil.STATUS_ZOMBIE and "pyspark.daemon" in " ".join(p.cmdline())
        except psutil.Error:
            return False

    return [p for p in psutil.Process(pid).children(recursive=True) if daemon(p) and daemon(p.parent())]


def _busy(workers: list[psutil.Process]) -> list[psutil.Process]:
    """The workers running a task now (PySpark keeps idle ones for reuse: killing those hurts nothing)."""
    for w in workers:
        with contextlib.suppress(psutil.Error):
            w.cpu_percent(None)
    time.sleep(0.3)
    busy = []
    for w in workers:
        try:
            if w.cpu_percent(None) > 20:
                busy.append(w)
        except psutil.Error:
            pass
    return busy


def _keep_log(run_dir: Path, attempt: int) -> None:
    """The attempt's spark-submit log, before a rerun writes over it."""
    log = run_dir.parent / f"{run_dir.name}.log"
    if log.exists():
        log.rename(log.with_suffix(f".attempt{attempt}.log"))


def _count(cluster: ComposeCluster, run_dir: Path) -> dict[str, Any]:
    m = read_manifest(run_dir)
    keys = committed_keys(cluster.client["bootstrap.servers"], m.topic)
    seen = Counter(keys)
    gaps = 0
    by_task: dict[int, list[int]] = {}
    for k in seen:
        task, idx = records.parse_key(k)
        by_task.setdefault(task, []).append(idx)
    for ix in by_task.values():
        gaps += max(ix) + 1 - len(ix)
    return {"sequences": m.sequences, "read": len(keys), "lost": max(0, m.sequences - len(seen)) + gaps,
            "duplicated": sum(n - 1 for n in seen.values())}


def publish_trial(cluster: ComposeCluster, corpus: Path, work: Path, n: int, fault: str,
                  rng: random.Random) -> dict[str, Any]:
    topic = f"stoker.soak.20261201.t{n}"
    run_dir = work / f"t{n}"
    task = rng.randrange(4)
    extra = ("--fail-first-attempt", f"{task}:committed") if fault == "committed" else ()
    proc = submit(corpus, topic, run_dir, cluster.client, True, *extra)
    delay, victim, retried = rng.uniform(0, 8), "", 0
    if fault == "committed":  # the failpoint kills the task's worker right after its commit
        delay, victim = 0.0, f"task {task}'s worker after its commit"
    try:
        await_publishing(cluster.client, topic, proc)
        time.sleep(delay)
        if proc.poll() is None:
            if fault == "worker" and (workers := _busy(_daemon_workers(proc.pid))):
                rng.choice(workers).send_signal(signal.SIGKILL)
                victim = "pyspark worker running a task"
            elif fault == "job":
                import os

                os.killpg(proc.pid, signal.SIGKILL)
                victim = "spark-submit"
            elif fault == "leader":
                victim = cluster.leader(topic, rng.randrange(4))
                cluster.kill(victim)
            elif fault == "coordinator":
                victim = cluster.coordinator(f"stoker:{topic}:p{rng.randrange(4)}", "__transaction_state")
                cluster.kill(victim)
        rc = proc.wait(timeout=900)
        if fault == "job" and victim:  # the rerun of the date, on the same topic
            _keep_log(run_dir, retried)
            rc = submit(corpus, topic, run_dir, cluster.client, False).wait(timeout=900)
            retried += 1
        while rc != 0 and retried < 3:  # as Airflow's retry: the next attempt's topic
            _keep_log(run_dir, retried)
            retried += 1
            topic = f"{topic}r{retried}"
            rc = submit(corpus, topic, run_dir, cluster.client, True).wait(timeout=900)
    finally:
        if victim.startswith("kafka-"):
            cluster.restart(victim)
    log = "".join(f.read_text(errors="replace") for f in sorted(run_dir.parent.glob(f"{run_dir.name}*.log")))
    failed = [line.strip()[:300] for line in log.splitlines() if "StokerError" in line or "KafkaException" in line]
    out = {"fault": fault, "delay_s": round(delay, 2), "victim": victim or "none (job ended first)",
           "retried": retried, "rc": rc, "spark_task_retries": log.count("Lost task"),
           "done_records_reused": log.count("reused its done record"), "first_errors": failed[:2]}
    return {**out, **(_count(cluster, run_dir) if rc == 0 else {"lost": None, "duplicated": None})}


def trainer_trial(cluster: ComposeCluster, tokenizer: Path, work: Path, n: int, rng: random.Random) -> dict[str, Any]:
    m = publish_run(cluster.client, tokenizer, work / f"t{n}", per_partition=120, replication=3, name="soaktrain")
    out = work / f"t{n}" / "train"
    manifest = RunLayout(work / f"t{n}").manifest
    kill_at = rng.randrange(2, 110)
    proc = launch_trainer(manifest, out, cluster.client, 2, "--checkpoint-every", "7")
    try:
        reached = await_step(out, kill_at, proc)
    except AssertionError:
        reached = -1  # ended first
    if proc.poll() is None:
        kill_tree(proc)
    steps = keys_by_step(out)  # the first life
    complete = complete_checkpoints(TrainerFiles(out).checkpoints)  # what the resume starts from
    ckpt_step = int(complete[-1].removeprefix("step")) if complete else 0
    for f in out.glob("keys.*.jsonl"):
        f.rename(f.with_suffix(".first"))
    rc = launch_trainer(manifest, out, cluster.client, 2, "--checkpoint-every", "7").wait(timeout=900)
    kept = [k for s, ks in steps.items() if s <= ckpt_step for k in ks]
    trained = kept + [k for ks in keys_by_step(out).values() for k in ks]
    published = {k.decode() for k in committed_keys(cluster.client["bootstrap.servers"], m.topic)}
    seen = Counter(trained)
    return {"fault": "trainer", "kill_step": reached, "checkpoint_step": ckpt_step, "rc": rc, "retried": 1,
            "victim": "launcher + 2 ranks", "sequences": m.sequences, "read": len(trained),
            "lost": len(published - set(seen)) + m.sequences - len(published),
            "duplicated": sum(n - 1 for n in seen.values())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    home, work, sample = soak_workspace("soak")
    corpus = write_corpus(work, sample, "soak", replication_factor=3, min_insync_replicas=2)
    cluster = ComposeCluster(home / "cluster").start()
    results: list[dict[str, Any]] = []
    t0 = time.time()
    try:
        # every fault once, then random ones
        plan = list(FAULTS) + [rng.choice(FAULTS) for _ in range(max(0, args.trials - len(FAULTS)))]
        for n, fault in enumerate(plan[:args.trials]):
            t = time.time()
            r = (trainer_trial(cluster, sample["tokenizer"], work, n, rng) if fault == "trainer"
                 else publish_trial(cluster, corpus, work, n, fault, rng))
            r["seconds"] = round(time.time() - t, 1)
            results.append(r)
            print(json.dumps(r), flush=True)
            with open(home / "results.jsonl", "a") as f:
                f.write(json.dumps(r) + "\n")
    finally:
        cluster.stop()
    bad = [r for r in results if r["lost"] != 0 or r["duplicated"] != 0]
    print(f"\nsoak (seed {args.seed}): {len(results)} trials in {time.time() - t0:.0f} s on a 3-node cluster")
    print(f"{'fault':<12}{'trials':>7}{'kills':>7}{'retried':>9}{'sequences':>11}{'lost':>6}{'dup':>6}")
    for fault in FAULTS:
        rs = [r for r in results if r["fault"] == fault]
        if rs:
            kills = sum(1 for r in rs if not str(r["victim"]).startswith("none"))
            print(f"{fault:<12}{len(rs):>7}{kills:>7}{sum(r['retried'] for r in rs):>9}"
                  f"{sum(r['sequences'] for r in rs if r.get('sequences')):>11}"
                  f"{sum(r['lost'] or 0 for r in rs):>6}{sum(r['duplicated'] or 0 for r in rs):>6}")
    print("every trial: 0 lost, 0 duplicated" if not bad else f"FAILED trials: {bad}")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
