"""Brokers killed (SIGKILL: no controlled shutdown) on docker-compose.yaml's 3-node KRaft cluster
(topics RF 3, min.insync.replicas 2), started by the test: the run topic's partition leader, and
separately the transaction coordinator's broker, while the Spark stage publishes; the partition
leader and then the training group's coordinator while the trainer consumes. Each case is counted
by Kafka's own ConsoleConsumer (read_committed): every sequence of the manifest exactly once, and
the trainer's keys equal the published ones."""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from stoker.kafka import offsets as koffsets
from stoker.kafka import topics as ktopics
from stoker.kafka.lag import compute_lag
from tests.support.fault_tools import assert_exactly_once, await_publishing, job_log, submit, write_corpus
from tests.support.kafka_cluster import ComposeCluster
from tests.support.trainer_tools import (
    all_keys,
    await_step,
    committed_keys,
    keys_by_step,
    kill_tree,
    launch_trainer,
    publish_run,
    wait_trainer,
)

pytestmark = pytest.mark.faults
REPO = Path(__file__).resolve().parents[2]
HOME = Path(os.environ["STOKER_HOME"]) / "faults-cluster"


@pytest.fixture(scope="module")
def cluster():
    c = ComposeCluster(HOME)
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture()
def corpus(tmp_path, sample_corpus) -> Path:
    return write_corpus(tmp_path, sample_corpus, "cluster", replication_factor=3, min_insync_replicas=2)


def _publish_through_a_kill(cluster: ComposeCluster, corpus: Path, run_dir: Path, topic: str,
                            victim: Callable[[], str]) -> str:
    """Publish ``corpus``; once records flow, kill the node ``victim`` names; the job must finish."""
    proc = submit(corpus, topic, run_dir, cluster.client)
    node = ""
    try:
        await_publishing(cluster.client, topic, proc, run_dir=run_dir)
        node = victim()
        cluster.kill(node)
        rc = proc.wait(timeout=900)
        log = job_log(run_dir).read_text(errors="replace")
        assert rc == 0, f"the job failed after {node} was killed:\n{log[-4000:]}"
        assert_exactly_once(cluster.client, run_dir)  # with one node of three down
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if node:
            cluster.restart(node)
    return node


def test_publish_survives_its_partition_leader_killed(cluster, corpus, tmp_path):
    topic = "stoker.cluster.20261201.a1"
    _publish_through_a_kill(cluster, corpus, tmp_path / "run", topic, lambda: cluster.leader(topic, 0))


def test_publish_survives_the_transaction_coordinator_killed(cluster, corpus, tmp_path):
    topic = "stoker.cluster.20261201.a2"
    # task 0's transactional id: its coordinator holds the open transaction's state when it dies
    coordinator = lambda: cluster.coordinator(f"stoker:{topic}:p0", "__transaction_state")  # noqa: E731
    _publish_through_a_kill(cluster, corpus, tmp_path / "run", topic, coordinator)


def test_training_survives_its_partition_leader_then_its_group_coordinator_killed(cluster, sample_corpus,
                                                                                   tmp_path):
    m = publish_run(cluster.client, sample_corpus["tokenizer"], tmp_path / "run", per_partition=300, replication=3,
                    name="clustertrain")
    out = tmp_path / "train"
    proc = launch_trainer(tmp_path / "run" / "manifest.json", out, cluster.client, 2, "--checkpoint-every", "5")
    try:
        await_step(out, 8, proc)
        leader = cluster.leader(m.topic, 0)
        cluster.kill(leader)  # the ranks fetch on from the new leaders
        await_step(out, 30, proc)
        cluster.restart(leader)
        coordinator = cluster.coordinator(f"stoker-train.{m.topic}", "__consumer_offsets")
        assert proc.poll() is None, "the trainer ended before its group coordinator could be killed"
        cluster.kill(coordinator)  # checkpoints commit the group's offsets through its new coordinator
        await_step(out, max(keys_by_step(out)) + 10, proc)
        cluster.restart(coordinator)
        wait_trainer(proc, out)
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    published = committed_keys(cluster.client["bootstrap.servers"], m.topic)  # Kafka's own reader
    assert len(published) == m.sequences and len(set(published)) == m.sequences
    trained = [k for ks in keys_by_step(out).values() for k in ks]
    assert not [k for k, n in Counter(trained).items() if n > 1], "a sequence was trained twice"
    assert sorted(trained) == sorted(k.decode() for k in published) == all_keys(m)
    committed = koffsets.committed_offsets(cluster.client, f"stoker-train.{m.topic}", m.topic, m.end_offsets())
    assert compute_lag(m.end_offsets(), committed).lag == 0  # the lag sensor sees the end


COMMIT_LOOP = """
import json, os, sys, time
from stoker.kafka import offsets as koffsets
from stoker.exceptions import StokerError
config, group, topic, stop_file = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
i, stop = 0, time.monotonic() + 300
while time.monotonic() < stop and not os.path.exists(stop_file):
    i += 1
    koffsets.commit_offsets(config, group, topic, {p: i for p in range(4)})  # rides through the failover itself
    for _ in range(60):  # a read fails while the coordinator moves (the lag trigger's next poll reads again)
        try:
            got = koffsets.committed_offsets(config, group, topic, range(4))
            break
        except StokerError as e:
            print("read failed:", e, flush=True)
            time.sleep(1)
    assert got == {p: i for p in range(4)}, got
    print(i, flush=True)
"""


def test_group_offsets_are_committed_and_read_through_their_coordinators_death(cluster, tmp_path):
    """A process that commits and reads a group's offsets in a loop (as the trainer's checkpoints and
    the lag trigger do) lives through a SIGKILL of the group's coordinator: no librdkafka abort, and
    every commit lands. librdkafka's Admin API aborts the process here (its coordinator requests)."""
    import json
    import subprocess
    import sys
    import time

    topic, group = f"stoker.coordkill.{time.time_ns()}", f"stoker-train.coordkill.{time.time_ns()}"
    ktopics.create_topic(cluster.client, topic, 4, 3, {"min.insync.replicas": "2"})
    log, stop = tmp_path / "commits.log", tmp_path / "stop"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-c", COMMIT_LOOP, json.dumps(cluster.client), group, topic,
                                 str(stop)], stdout=out, stderr=subprocess.STDOUT, cwd=REPO)

    def commits() -> int:
        return sum(line.isdigit() for line in log.read_text(errors="replace").splitlines())

    def await_commits(n: int) -> None:
        deadline = time.monotonic() + 240
        while commits() < n:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)

    coordinator = ""
    try:
        await_commits(20)  # committing steadily
        coordinator = cluster.coordinator(group, "__consumer_offsets")
        cluster.kill(coordinator)
        await_commits(commits() + 30)  # past the kill: 30 more commits, read back, through the new coordinator
        stop.touch()
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        if coordinator:
            cluster.restart(coordinator)
    text = log.read_text(errors="replace")
    assert rc == 0, f"the committing process ended with {rc} after {coordinator} was killed:\n{text[-3000:]}"
    last = max(int(line) for line in text.splitlines() if line.isdigit())
    assert koffsets.committed_offsets(cluster.client, group, topic, range(4)) == {p: last for p in range(4)}
    ktopics.delete_topics(cluster.client, [topic])
