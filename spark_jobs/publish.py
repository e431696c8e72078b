"""Exactly-once publishing of one Spark partition: one Kafka transaction per Spark task.

Why not Spark's Kafka sink: it is at-least-once, so a retried task duplicates sequences.
Here each Spark partition ``p`` owns a fixed ``transactional.id`` (run topic + ``p``):

1. ``init_transactions()`` fences any earlier attempt of the same partition (a zombie can no
   longer commit) and aborts its open transaction, so its records are never visible to a
   read_committed consumer.
2. The task looks for its *done record* in ``<topic>.tasks`` (read_committed). Present means an
   earlier attempt committed; the task returns that attempt's counts and publishes nothing.
3. Otherwise it publishes every sequence and its done record in one transaction and commits.

Sequences and the done record commit atomically, so whatever Spark retries, each sequence of
the partition is visible exactly once.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from stoker import records
from stoker.layout import tasks_topic

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

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> TaskSummary:
        return cls(**json.loads(raw))


class InjectedFailure(RuntimeError):
    """Raised on purpose by tests (--fail-first-attempt) to prove retries neither lose nor duplicate."""


def _producer(config: Mapping[str, Any], transactional_id: str, compression: str, tx_timeout_ms: int):
    from confluent_kafka import Producer

    conf = dict(config)
    conf.update({
        "transactional.id": transactional_id,
        "enable.idempotence": True,
        "acks": "all",
        "compression.type": compression,
        "linger.ms": 20,
        "batch.size": 1 << 20,
        "transaction.timeout.ms": tx_timeout_ms,
    })
    return Producer(conf)


def find_done(config: Mapping[str, Any], topic: str, spark_partition: int) -> TaskSummary | None:
    """The committed done record of ``spark_partition``, if an earlier attempt wrote one."""
    from stoker.kafka import read_all

    want = records.make_key(spark_partition, 0)[:6]  # b"p00003"
    found = [m for m in read_all(config, tasks_topic(topic)) if m.key() == want]
    return TaskSummary.from_json(found[-1].value() or b"") if found else None


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
) -> Iterator[TaskSummary]:
    """Publish ``packed`` (items with ``tokens``, ``doc_starts``, ``valid``) in one transaction.

    ``summary`` is filled by the caller's packer as the iterator is consumed (docs, tokens,
    padding); sequences and per-partition counts are filled here.
    """
    producer = _producer(config, f"stoker:{topic}:p{spark_partition}", compression, tx_timeout_ms)
    producer.init_transactions(TX_INIT_TIMEOUT_S)  # fences and aborts earlier attempts
    done = find_done(config, topic, spark_partition)
    if done is not None:
        done.reused, done.attempt = True, attempt
        yield done
        return
    producer.begin_transaction()
    try:
        counts = [0] * kafka_partitions
        for i, seq in enumerate(packed):
            if fail_after is not None and i == fail_after:
                producer.flush(30)  # make sure the doomed records really reached the broker
                raise InjectedFailure(f"injected failure in spark partition {spark_partition} after {i} sequences")
            kp = (spark_partition + i) % kafka_partitions
            value = records.encode_value(seq.tokens, dtype)
            headers = records.encode_headers(run_id, dtype, seq.doc_starts, seq.valid)
            _produce(producer, topic, kp, records.make_key(spark_partition, i), value, headers)
            counts[kp] += 1
        summary.sequences = sum(counts)
        summary.per_partition = {str(k): c for k, c in enumerate(counts) if c}
        _produce(producer, tasks_topic(topic), 0, records.make_key(spark_partition, 0)[:6],
                 summary.to_json().encode(), None)
        producer.commit_transaction(tx_timeout_ms / 1000)
    except BaseException:
        with contextlib.suppress(Exception):  # the fencing on retry aborts it anyway
            producer.abort_transaction(30)
        raise
    yield summary


def _produce(producer: Any, topic: str, partition: int, key: bytes, value: bytes, headers: Any) -> None:
    while True:
        try:
            producer.produce(topic, value=value, key=key, partition=partition, headers=headers)
            return
        except BufferError:  # local queue full: serve delivery callbacks and retry
            producer.poll(0.5)
