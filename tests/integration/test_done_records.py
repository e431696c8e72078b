"""A retried Spark task must find its own committed done record whatever other tasks' transactions
are doing: a record committed behind another task's still-open transaction is invisible to a
read_committed reader, which once let a retry publish its sequences a second time."""

from __future__ import annotations

import dataclasses
import subprocess
import threading
import time
import uuid

import numpy as np
import pytest

from spark_jobs import publish
from spark_jobs.steps import Packed
from stoker.exceptions import StokerError
from stoker.kafka import offsets as koffsets
from stoker.kafka import topics as ktopics
from stoker.layout import tasks_topic
from stoker.run import records

pytestmark = pytest.mark.integration


def _sequences(n: int) -> list[Packed]:
    return [Packed(tokens=np.arange(i, i + 9, dtype=np.int64), doc_starts=[0], valid=None) for i in range(n)]


def _publish(kafka_config, topic: str, task: int, attempt: int, task_partitions: int) -> publish.TaskSummary:
    summary = publish.TaskSummary(spark_partition=task, attempt=attempt)
    out = list(publish.publish_partition(
        iter(_sequences(5)), config=kafka_config, topic=topic, kafka_partitions=2, spark_partition=task,
        attempt=attempt, run_id="test/2026-12-08", dtype="uint16", compression="zstd", tx_timeout_ms=60_000,
        summary=summary, task_partitions=task_partitions))
    return out[0]


def _open_done_record(kafka_config, topic: str, task: int, task_partitions: int):
    """Task ``task``'s attempt wrote its done record and died before committing: a real transaction,
    left open on the broker (until fenced or timed out)."""
    zombie = publish._producer(kafka_config, f"stoker:{topic}:p{task}", "zstd", 60_000)
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(tasks_topic(topic), partition=task % task_partitions, key=records.done_key(task),
                   value=publish.TaskSummary(spark_partition=task, attempt=0).to_json().encode())
    zombie.flush(30)
    return zombie


@pytest.mark.parametrize("task_partitions", [2, 1])
def test_a_retry_finds_its_done_record_behind_another_tasks_open_transaction(kafka_config, task_partitions):
    topic = f"stoker.test.20261208.t{task_partitions}"
    koffsets.recreate_topic(kafka_config, topic, 2)
    koffsets.recreate_topic(kafka_config, tasks_topic(topic), task_partitions)
    zombie = _open_done_record(kafka_config, topic, 1, task_partitions)
    aborted: list[bool] = []
    ender = threading.Timer(3.0, lambda: aborted.append(zombie.abort_transaction(30) is None))
    shared = task_partitions == 1
    if shared:  # sharing a tasks partition (more than 256 tasks), any attempt's look for its done record waits
        ender.start()  # for the open transaction to end (fenced, aborted or timed out) rather than miss what lies
    started = time.monotonic()  # behind it: here until the zombie aborts, 3 s on (not its 60 s timeout)
    first = _publish(kafka_config, topic, 0, 0, task_partitions)
    assert not first.reused and first.sequences == 5
    assert (time.monotonic() - started >= 2.5) == shared  # with a partition of its own a task never waits
    if not shared:  # task 0 committed behind the open transaction; its retry finds the record all the same
        ender.start()
    again = _publish(kafka_config, topic, 0, 1, task_partitions)
    assert again.reused and again.sequences == 5  # found, so nothing published twice
    ender.join()
    assert aborted == [True]  # the zombie's transaction ended by its abort, not by its timeout
    keys = [m.key() for m in koffsets.read_all(kafka_config, topic)]
    assert sorted(keys) == [records.make_key(0, i) for i in range(5)]
    ktopics.delete_topics(kafka_config, [topic, tasks_topic(topic)])


def test_the_independent_read_fails_loudly_on_a_lost_or_duplicated_sequence(kafka_config):
    topic = "stoker.test.20261209.a1"
    koffsets.recreate_topic(kafka_config, topic, 2)
    koffsets.recreate_topic(kafka_config, tasks_topic(topic), 1)
    done = _publish(kafka_config, topic, 0, 0, 1)
    assert publish.verify_published(kafka_config, topic, [done]) == {0: 3, 1: 2}

    claimed = dataclasses.replace(done, sequences=6)  # one the broker never got
    with pytest.raises(StokerError, match=r"lost \{0: 1\}"):
        publish.verify_published(kafka_config, topic, [claimed])

    other = publish._producer(kafka_config, "stoker:test:intruder", "zstd", 60_000)  # a second copy of s1
    other.init_transactions(30)
    other.begin_transaction()
    other.produce(topic, partition=1, key=records.make_key(0, 1), value=b"\0\0")
    other.commit_transaction(30)
    with pytest.raises(StokerError, match=r"duplicated \{0: 1\}"):
        publish.verify_published(kafka_config, topic, [done])
    ktopics.delete_topics(kafka_config, [topic, tasks_topic(topic)])


def _producer_epoch(bootstrap: str, transactional_id: str) -> int:
    """The coordinator's current epoch of ``transactional_id``, asked through Kafka's own TransactionsCommand."""
    from stoker_local import broker

    res = subprocess.run(broker.tool_command("org.apache.kafka.tools.TransactionsCommand", "--bootstrap-server",
                                             bootstrap, "describe", "--transactional-id", transactional_id),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    header, row = (line.split() for line in res.stdout.strip().splitlines()[-2:])
    return int(row[header.index("ProducerEpoch")])


def _slowly(n: int, pause: float):
    for seq in _sequences(n):
        time.sleep(pause)
        yield seq


def test_every_transaction_of_a_task_has_a_fresh_producer_epoch(kafka_config):
    """librdkafka does not speak KIP-890 part 2, so the broker does not bump a producer's epoch between its
    transactions: the publisher takes a new producer, and a new epoch, for each (see spark_jobs/publish.py)."""
    topic = f"stoker.test.20261210.e{uuid.uuid4().hex[:8]}"  # a transactional id the broker has never seen
    koffsets.recreate_topic(kafka_config, topic, 2)
    koffsets.recreate_topic(kafka_config, tasks_topic(topic), 1)
    summary = publish.TaskSummary(spark_partition=0, attempt=0)
    done = next(publish.publish_partition(  # a transaction is due every second (half the timeout)
        _slowly(6, 0.45), config=kafka_config, topic=topic, kafka_partitions=2, spark_partition=0, attempt=0,
        run_id="test/2026-12-10", dtype="uint16", compression="zstd", tx_timeout_ms=2_000, summary=summary))
    assert done.transactions >= 2 and done.sequences == 6
    tid = f"stoker:{topic}:p0"
    first = _producer_epoch(kafka_config["bootstrap.servers"], tid)
    assert first == done.transactions - 1  # epochs 0, 1, ...: one init_transactions() per transaction
    again = _publish(kafka_config, topic, 0, 1, 1)  # a retry fences with an epoch of its own, and finds it done
    assert again.reused and _producer_epoch(kafka_config["bootstrap.servers"], tid) == first + 1
    assert publish.verify_published(kafka_config, topic, [done]) == {0: 3, 1: 3}
    ktopics.delete_topics(kafka_config, [topic, tasks_topic(topic)])
