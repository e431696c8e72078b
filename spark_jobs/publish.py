"""Exactly-once publishing of one Spark partition: Kafka transactions of one Spark task.

Why not Spark's Kafka sink: it is at-least-once, so a retried task duplicates sequences.
Here each Spark partition ``p`` owns a fixed ``transactional.id`` (run topic + ``p``):

1. ``init_transactions()`` fences any earlier attempt of the same partition (a zombie can no
   longer commit) and aborts its open transaction, so its records are never visible to a
   read_committed consumer.
2. The task looks for its *done record* in its partition of ``<topic>.tasks`` (read_committed, up
   to the high watermark: see :func:`find_done`). Present means an earlier attempt committed; the
   task returns that attempt's counts and publishes nothing.
3. Otherwise it publishes its sequences in transactions of at most half the transaction timeout
   each (a whole compressed file is one task, and its publish may take longer than any timeout):
   every transaction commits its sequences with a done record saying how many of the task's
   sequences are committed so far; the last one's done record is marked final and holds the
   task's summary.

Each transaction runs on a producer of its own, whose ``init_transactions()`` gives it a fresh
producer epoch. Kafka 4's brokers bump the epoch after every transaction only for clients that speak
KIP-890 part 2 (``transaction.version=2``), and librdkafka does not yet (confluentinc/librdkafka#5423):
consecutive transactions on one producer would share an epoch, the window in which a delayed produce or
EndTxn of one transaction is applied to the next (Jepsen's 2024 analyses of Kafka-compatible systems).
With a new epoch, the broker fences whatever of an earlier transaction is still on the wire. And a
producer is never used again after an error whose outcome is unknown (a commit or abort that timed
out): the task fails, and Spark's retry starts from ``init_transactions()`` on a new producer, which
settles the earlier transaction (completed or aborted) before the retry reads its done record.

Sequences and their done record commit atomically. A retry finds the newest done record: a final
one means the task is complete (nothing is published again); an earlier one means the retry, whose
sequence stream is the same (the same records packed in the same order), skips the sequences already
committed and continues after them. So whatever Spark retries, each sequence of the partition is
visible exactly once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from stoker.kafka.clients import Role
from stoker.kafka.clients import consumer as kafka_consumer
from stoker.layout import tasks_topic
from stoker.run import records

TX_INIT_TIMEOUT_S = 120.0


@dataclass(slots=True)
class TaskSummary:
    spark_partition: int
    attempt: int
    docs: int = 0
    sequences: int = 0
    tokens: int = 0
    padding: int = 0
    per_partition: dict[str, int] = field(default_factory=dict)
    """Kafka partition (as a string, JSON keys) → sequences."""
    source_tokens: dict[str, int] = field(default_factory=dict)
    """Source file → tokens of its documents packed by this task (EOS included)."""
    reused: bool = False
    """True when an earlier attempt had already committed this partition."""
    committed: int = 0
    """Sequences of the task committed up to this done record (a task's transactions, in order)."""
    final: bool = True
    """The task's last done record (its summary is complete); done records of an earlier Stoker are final."""
    resumed: int = 0
    """Sequences an earlier attempt had committed, which this attempt skipped."""
    transactions: int = 0
    """Transactions this attempt committed."""
    scrubbed_docs: int = 0
    """Documents of the task (trained or held out) whose e-mail or IP addresses the PII scrubbing replaced."""
    scrubbed_addresses: int = 0
    """Addresses it replaced in them."""
    parity_checked: int = 0
    """Documents this attempt also encoded with the reference tokenizer (``tokenizer.check_every``), all equal."""

    def add_scrubbed(self, addresses: list[int]) -> None:
        """Count a batch of documents by the addresses the scrubbing replaced in each."""
        self.scrubbed_docs += sum(map(bool, addresses))
        self.scrubbed_addresses += sum(addresses)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> TaskSummary:
        return cls(**json.loads(raw))


class InjectedFailure(RuntimeError):
    """Raised on purpose by tests (--fail-first-attempt) to prove retries neither lose nor duplicate."""


def _producer(config: Mapping[str, Any], transactional_id: str, compression: str, tx_timeout_ms: int):
    from stoker.kafka.clients import producer

    return producer(config, **{"transactional.id": transactional_id, "compression.type": compression,
                               "transaction.timeout.ms": tx_timeout_ms})


TASK_PARTITIONS_MAX = 256


def task_partitions(tasks: int) -> int:
    """Partitions of ``<topic>.tasks``: one per task, up to 256 (beyond, tasks share and find_done waits)."""
    return max(1, min(tasks, TASK_PARTITIONS_MAX))


def find_done(config: Mapping[str, Any], topic: str, spark_partition: int, partitions: int = 1,
              timeout: float = TX_INIT_TIMEOUT_S) -> TaskSummary | None:
    """The committed done record of ``spark_partition``, if an earlier attempt wrote one.

    A read_committed reader stops at the last stable offset: a done record committed behind another
    task's open transaction (a task killed between its done record and its commit keeps one open
    until it is fenced or times out) is invisible there, and a retry that missed it would publish
    again. So each task has its own partition of ``<topic>.tasks``, and the read goes on until it
    passes the high watermark seen at its start: behind an open transaction it waits, never misses.
    """
    want = records.done_key(spark_partition)
    found = [m for m in read_settled(config, tasks_topic(topic), spark_partition % partitions, timeout)
             if m.key() == want]
    return TaskSummary.from_json(found[-1].value() or b"") if found else None


def read_settled(config: Mapping[str, Any], topic: str, partition: int, timeout: float) -> list[Any]:
    """The committed records of one partition up to its high watermark at the call: every
    transaction open below it has ended (committed, aborted or timed out) when this returns."""
    from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

    from stoker.exceptions import KafkaTimeout, StokerError
    from stoker.kafka.offsets import end_offsets

    high = end_offsets(config, topic, committed_only=False)[partition]
    if high == 0:
        return []
    consumer = kafka_consumer(config, Role.READER, "stoker-find-done")
    tp, out, deadline = TopicPartition(topic, partition, OFFSET_BEGINNING), [], time.monotonic() + timeout
    try:
        consumer.assign([tp])
        while True:
            msg = consumer.poll(0.2)
            err = msg.error() if msg is not None else None
            if msg is not None and err is None:
                out.append(msg)
            elif err is not None and err.code() != KafkaError._PARTITION_EOF:
                raise StokerError(f"reading {topic}[{partition}]: {err}")
            if consumer.position([tp])[0].offset >= high:
                return out
            if time.monotonic() > deadline:
                raise KafkaTimeout(f"{topic}[{partition}]: a transaction below offset {high} is still open after "
                                   f"{timeout:.0f}s; it ends when its producer is fenced or after "
                                   "publish.transaction_timeout_ms, and Spark's retry of this task will find it then")
    finally:
        consumer.close()


KILL_AFTER_COMMIT = -1
"""``fail_after`` that kills the task's worker (SIGKILL) right after its commit (testing)."""


def publish_partition(
    packed: Iterable[records.PackedSequence | Any],
    *,
    config: Mapping[str, Any],
    topic: str,
    kafka_partitions: int,
    spark_partition: int,
    attempt: int,
    run_id: str,
    dtype: str,
    compression: str,
    tx_timeout_ms: int,
    summary: TaskSummary,
    fail_after: int | None = None,
    task_partitions: int = 1,
) -> Iterator[TaskSummary]:
    """Publish ``packed`` (items with ``tokens``, ``doc_starts``, ``valid``) in the task's transactions (see
    the module), resuming after what an earlier attempt committed.

    ``summary`` is filled by the caller's packer as the iterator is consumed (docs, tokens,
    padding); sequences and per-partition counts are filled here.
    """
    tx = _Transactions(lambda: _producer(config, f"stoker:{topic}:p{spark_partition}", compression, tx_timeout_ms),
                       topic, spark_partition, attempt, task_partitions, tx_timeout_ms)
    tx.fresh()  # fences and aborts earlier attempts
    done = find_done(config, topic, spark_partition, task_partitions)
    if done is not None and done.final:
        tx.retire(clean=True)
        done.reused, done.attempt = True, attempt
        yield done
        return
    resume = done.committed if done is not None else 0
    try:
        counts = [0] * kafka_partitions
        for i, seq in enumerate(packed):
            kp = (spark_partition + i) % kafka_partitions
            counts[kp] += 1
            if i < resume:  # committed by an earlier attempt: the stream is the same, so is sequence i
                continue
            if fail_after is not None and i == fail_after:
                tx.open().flush(30)  # make sure the doomed records really reached the broker
                raise InjectedFailure(f"injected failure in spark partition {spark_partition} after {i} sequences")
            value = records.encode_value(seq.tokens, dtype)
            headers = records.encode_headers(run_id, dtype, seq.doc_starts, seq.valid)
            _produce(tx.open(), topic, kp, records.make_key(spark_partition, i), value, headers)
            if tx.due():
                tx.commit(TaskSummary(spark_partition=spark_partition, attempt=attempt, committed=i + 1, final=False))
        summary.sequences = sum(counts)
        summary.per_partition = {str(k): c for k, c in enumerate(counts) if c}
        summary.committed, summary.resumed = summary.sequences, resume
        tx.open()
        summary.transactions = tx.count + 1
        tx.commit(summary)
        if fail_after == KILL_AFTER_COMMIT:  # testing: the commit landed, its result never reaches the driver
            os.kill(os.getpid(), signal.SIGKILL)
    except BaseException:
        tx.abandon()
        raise
    yield summary


class _Transactions:
    """A task's transactions in turn, each on a producer of its own (a fresh epoch: see the module). Each is
    committed, with a done record, once it has been open for half the transaction timeout (the broker
    aborts one that outlives it)."""

    def __init__(self, make_producer: Callable[[], Any], topic: str, spark_partition: int, attempt: int,
                 task_partitions: int, tx_timeout_ms: int) -> None:
        self.make_producer = make_producer
        self.producer: Any = None
        self.topic, self.sp, self.attempt = topic, spark_partition, attempt
        self.task_partitions, self.timeout_s = task_partitions, tx_timeout_ms / 1000
        self.started: float | None = None
        self.count = 0
        self.epochs = 0
        """Producers initialised (``init_transactions()``) by this task: one per transaction it began."""

    def fresh(self) -> Any:
        """The producer of the next transaction, with an epoch of its own."""
        if self.producer is None:
            self.producer = self.make_producer()
            self.producer.init_transactions(TX_INIT_TIMEOUT_S)
            self.epochs += 1
        return self.producer

    def open(self) -> Any:
        if self.started is None:
            self.fresh().begin_transaction()
            self.started = time.monotonic()
        return self.producer

    def due(self) -> bool:
        return self.started is not None and time.monotonic() - self.started >= self.timeout_s / 2

    def commit(self, done: TaskSummary) -> None:
        _produce(self.producer, tasks_topic(self.topic), self.sp % self.task_partitions,
                 records.done_key(self.sp), done.to_json().encode(), None)
        try:
            self.producer.commit_transaction(self.timeout_s)
        except BaseException:
            self.retire()  # its outcome may be unknown: never used again, whatever the error said
            raise
        self.started, self.count = None, self.count + 1
        self.retire(clean=True)  # the next transaction begins on a new producer, with a new epoch

    def abandon(self) -> None:
        """After a failure inside a transaction: abort it where the producer is still sound (an abort that
        fails or times out is not retried: the fencing of Spark's retry ends the transaction anyway)."""
        if self.producer is not None and self.started is not None:
            with contextlib.suppress(Exception):
                self.producer.abort_transaction(30)
        self.retire()

    def retire(self, clean: bool = False) -> None:
        """Let the producer go. ``clean`` (after its commit): closed, nothing is left to send. Otherwise what it
        still holds is purged, so nothing of its transaction is sent after the task gave up on it, and it is
        dropped without ``close()``, which would abort its transaction (a request whose answer may never come);
        Spark's retry fences it."""
        if self.producer is not None:
            producer, self.producer, self.started = self.producer, None, None
            with contextlib.suppress(Exception):
                producer.purge()
                if clean:
                    producer.close()


def _produce(producer: Any, topic: str, partition: int, key: bytes, value: bytes, headers: Any) -> None:
    while True:
        try:
            producer.produce(topic, value=value, key=key, partition=partition, headers=headers)
            return
        except BufferError:  # local queue full: serve delivery callbacks and retry
            producer.poll(0.5)


def verify_published(config: Mapping[str, Any], topic: str, summaries: list[TaskSummary],
                     timeout: float = 600.0) -> dict[int, int]:
    """An independent read of what the broker serves a read_committed consumer, checked against the
    tasks' own summaries: every task's keys ``0..sequences-1`` exactly once, and each partition's
    count as the tasks reported. Raises on any loss or duplicate; returns sequences per partition.
    Memory: one byte per sequence."""
    import numpy as np
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    from stoker.exceptions import KafkaTimeout, StokerError
    from stoker.kafka.offsets import stable_end_offsets

    ends = stable_end_offsets(config, topic)
    seen = {s.spark_partition: np.zeros(s.sequences, dtype=np.uint8) for s in summaries}
    per_part = dict.fromkeys(ends, 0)
    consumer = kafka_consumer(config, Role.READER, "stoker-verify",
                              **{"fetch.max.bytes": 64 << 20, "enable.partition.eof": False})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p, e in ends.items() if e > 0])
    pending, deadline, stray = {p for p, e in ends.items() if e > 0}, time.monotonic() + timeout, []
    try:
        while pending:
            if time.monotonic() > deadline:
                raise KafkaTimeout(f"verifying {topic}: partitions {sorted(pending)} not read to the end in {timeout}s")
            for msg in consumer.consume(10_000, 0.1):  # short: a small topic is read in one wait, not a second
                if msg.error() is not None:
                    raise StokerError(f"verifying {topic}: {msg.error()}")
                part = int(msg.partition() or 0)
                task, idx = records.parse_key(msg.key() or b"")
                if task in seen and idx < len(seen[task]):
                    seen[task][idx] += 1
                else:
                    stray.append(msg.key())
                per_part[part] += 1
            pos = {tp.partition: tp.offset for tp in consumer.position([TopicPartition(topic, p) for p in pending])}
            pending = {p for p in pending if pos[p] < ends[p]}
    finally:
        consumer.close()
    lost = {t: int((a == 0).sum()) for t, a in seen.items() if (a == 0).any()}
    dup = {t: int((a > 1).sum()) for t, a in seen.items() if (a > 1).any()}
    reported = {p: sum(s.per_partition.get(str(p), 0) for s in summaries) for p in ends}
    if lost or dup or stray or per_part != reported:
        raise StokerError(f"{topic}: the broker's committed records do not match what the tasks published: lost "
                          f"{lost or 0} and duplicated {dup or 0} sequences by task, {len(stray)} unknown keys "
                          f"{stray[:3]}, per partition {per_part} vs reported {reported}; no manifest is written")
    return per_part
