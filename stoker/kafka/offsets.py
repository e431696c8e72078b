"""Offsets of a topic and of a consumer group: end, start and stable end offsets, committed and
committing, and reading a topic whole (the admin verbs the sensors, the trainer and the tests share).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from stoker.exceptions import KafkaTimeout, StokerError, TopicNotFound
from stoker.kafka.clients import Role, admin, consumer
from stoker.kafka.topics import TIMEOUT_S, _wait, create_topic, delete_topics, topic_partitions


def end_offsets(config: Mapping[str, Any], topic: str, committed_only: bool = True) -> dict[int, int]:
    """Per-partition end offsets; with ``committed_only`` the last stable offset (what a
    read_committed consumer can reach), else the high watermark."""
    return _list_offsets(config, topic, "latest", committed_only)


def stable_end_offsets(config: Mapping[str, Any], topic: str, timeout: float = 60.0) -> dict[int, int]:
    """End offsets once every transaction on ``topic`` is settled (last stable offset = high watermark).

    A committed transaction's markers reach the partitions asynchronously after
    ``commit_transaction()`` returns, so the read_committed end offset can trail for a moment; a
    manifest must never record such a transient value.
    """
    deadline = time.monotonic() + timeout
    while True:
        stable, high = end_offsets(config, topic), end_offsets(config, topic, committed_only=False)
        if stable == high:
            return stable
        if time.monotonic() > deadline:
            raise KafkaTimeout(f"topic {topic!r}: open transactions after {timeout:.0f}s (stable {stable}, "
                               f"high watermark {high}): a producer is still writing to it")
        time.sleep(0.2)


def start_offsets(config: Mapping[str, Any], topic: str) -> dict[int, int]:
    """Per-partition earliest offsets (the log start)."""
    return _list_offsets(config, topic, "earliest", False)


def _list_offsets(config: Mapping[str, Any], topic: str, spec: str, committed_only: bool) -> dict[int, int]:
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    n = topic_partitions(config, topic)
    if n is None:
        raise TopicNotFound(f"topic {topic!r} does not exist")
    level = IsolationLevel.READ_COMMITTED if committed_only else IsolationLevel.READ_UNCOMMITTED
    which = OffsetSpec.latest() if spec == "latest" else OffsetSpec.earliest()
    req = {TopicPartition(topic, p): which for p in range(n)}
    client = admin(config)
    deadline = time.monotonic() + TIMEOUT_S
    while True:  # leadership moves (a new topic, a broker restart) answer with retriable errors
        try:
            res = _wait(client.list_offsets(req, isolation_level=level, request_timeout=TIMEOUT_S), "list_offsets")
            return {tp.partition: info.offset for tp, info in res.items()}
        except StokerError as e:
            if not _retriable(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def _transient(err: Any, codes: Iterable[int]) -> bool:
    """Whether a KafkaError is worth another try: librdkafka says so, or it is one of ``codes``."""
    return bool(err.retriable()) or err.code() in codes


def _retriable(e: StokerError) -> bool:
    from confluent_kafka import KafkaError, KafkaException

    cause = e.__cause__
    # a partition whose leadership is settling (a new topic, a failover) answers with any of these until
    # every broker has the new leader epoch: UNKNOWN_LEADER_EPOCH was seen on a fresh 3-node cluster, and
    # librdkafka's local _NOENT ("Failed to query partition leaders: No leaders found") when its metadata
    # for a topic made a moment ago had no leader yet (the topic is known to exist: _list_offsets asked)
    return isinstance(cause, KafkaException) and _transient(cause.args[0], (KafkaError._NOENT,
        KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.FENCED_LEADER_EPOCH, KafkaError.REPLICA_NOT_AVAILABLE,
        KafkaError.OFFSET_NOT_AVAILABLE))


def _group_member(config: Mapping[str, Any], group: str, **extra: Any) -> Any:
    """A consumer of ``group`` that never joins it: it reads and commits the group's offsets by the
    group protocol (OffsetFetch, OffsetCommit), not the Admin API, whose requests to a group coordinator
    abort the whole process when the coordinator's connection drops mid-request (librdkafka's
    ``rd_kafka_admin_coord_request`` frees a request it still refers to: ``rd_kafka_enq_once_del_source_return:
    Assertion eonce->refcnt > 0``, librdkafka issues 4605 and 3663; unfixed in 2.16). Seen here when a
    coordinator was killed under a trainer's checkpoint commit."""
    return consumer(config, Role.GROUP_MEMBER, group, **extra)


def _coordinator_moving(err: Any) -> bool:
    from confluent_kafka import KafkaError

    return _transient(err, (
        KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.REQUEST_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._WAIT_COORD))


def committed_offsets(
    config: Mapping[str, Any], group: str, topic: str, partitions: Iterable[int], deadline_s: float = 60.0
) -> dict[int, int | None]:
    """The group's committed offset per partition (None where nothing is committed). While the group's
    coordinator is not ready (a fresh broker still loading ``__consumer_offsets``, a failover) the
    fetch answers NOT_COORDINATOR or the like: it is asked again until ``deadline_s``."""
    from confluent_kafka import KafkaException, TopicPartition

    wanted = [TopicPartition(topic, p) for p in partitions]
    member = _group_member(config, group)
    give_up, pause = time.monotonic() + deadline_s, 0.5
    cause: KafkaException | None
    try:
        while True:
            try:
                found = member.committed(wanted, timeout=TIMEOUT_S)
            except KafkaException as e:
                err, where, cause = e.args[0], f"{topic} failed", e
            else:
                failed = next((tp for tp in found if tp.error is not None), None)
                if failed is None:
                    return {tp.partition: tp.offset if tp.offset >= 0 else None for tp in found}
                err, where, cause = failed.error, f"{topic}[{failed.partition}]", None
            if not _coordinator_moving(err) or time.monotonic() + pause > give_up:
                raise StokerError(f"committed offsets of group {group!r} on {where}: {err}") from cause
            time.sleep(pause)
            pause = min(pause * 2, 5.0)
    finally:
        member.close()


def commit_offsets(config: Mapping[str, Any], group: str, topic: str, offsets: Mapping[int, int],
                   deadline_s: float = 180.0) -> None:
    """Commit ``offsets`` (next offset to read, per partition) for ``group`` without joining it.

    While the group's coordinator fails over (its broker killed: the controller notices after the
    broker session timeout, then a new leader of its ``__consumer_offsets`` partition takes over), a
    commit times out or is refused as retriable: it is sent again until ``deadline_s``."""
    from confluent_kafka import KafkaException, TopicPartition

    if not offsets:
        return
    tps = [TopicPartition(topic, p, o) for p, o in sorted(offsets.items())]
    results: list[tuple[Any, list[Any]]] = []
    member = _group_member(config, group, on_commit=lambda err, parts: results.append((err, parts)))
    give_up, pause = time.monotonic() + deadline_s, 1.0
    try:
        while True:
            results.clear()
            try:
                member.commit(offsets=tps, asynchronous=True)
            except KafkaException as e:  # refused before it was sent
                results.append((e.args[0], []))
            wait_until = min(time.monotonic() + TIMEOUT_S, give_up)
            while not results and time.monotonic() < wait_until:
                member.poll(0.2)  # serves the commit's callback
            err = None
            if results:  # the commit's answer: an error of the request, else of any partition
                err, parts = results[0]
                err = err or next((tp.error for tp in parts if tp.error), None)
                if err is None:
                    return
            if (err is not None and not _coordinator_moving(err)) or time.monotonic() + pause > give_up:
                raise StokerError(f"committing offsets {dict(offsets)} of {topic} for group {group!r} failed: "
                                  f"{err or f'no answer in {deadline_s:.0f} s'}")
            time.sleep(pause)
            pause = min(pause * 2, 10.0)
    finally:
        member.close()


def read_all(config: Mapping[str, Any], topic: str, committed_only: bool = True, timeout: float = 60.0) -> list[Any]:
    """Every message of ``topic`` up to its current end offsets (for checks and tools, not the
    training hot path). With ``committed_only`` a read_committed consumer: aborted records and
    transaction markers are skipped."""
    from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

    ends = end_offsets(config, topic, committed_only=committed_only)
    reader = consumer(config, Role.READER, "stoker-read-all",
                      **{"isolation.level": "read_committed" if committed_only else "read_uncommitted"})
    out: list[Any] = []
    try:
        pending = {p for p, e in ends.items() if e > 0}
        reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(pending)])
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise KafkaTimeout(f"reading {topic}: partitions {sorted(pending)} not at their end after {timeout}s")
            msg = reader.poll(1.0)
            if msg is None:
                continue
            part, offset, err = int(msg.partition() or 0), int(msg.offset() or 0), msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    if offset >= ends[part]:
                        pending.discard(part)
                    continue
                raise StokerError(f"reading {topic}: {err}")
            out.append(msg)
            if offset + 1 >= ends[part]:
                pending.discard(part)
    finally:
        reader.close()
    return out


def recreate_topic(
    config: Mapping[str, Any],
    name: str,
    partitions: int,
    replication_factor: int = 1,
    topic_config: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> None:
    """Make ``name`` exist and be empty: delete what an earlier run left under that name, wait until
    the broker has forgotten it (deletion is asynchronous), then create it afresh.

    Between the create and the check that the topic is empty, the name can vanish: the create answered
    "already exists" for an old copy whose deletion then finished, or the broker that answers the offsets'
    metadata has not heard of the new topic yet (seen on the 3-node cluster). Both are asked again."""
    from confluent_kafka import KafkaError, KafkaException

    delete_topics(config, [name])
    deadline = time.monotonic() + timeout
    while True:
        try:
            create_topic(config, name, partitions, replication_factor, topic_config)
            if all(v == 0 for v in end_offsets(config, name, committed_only=False).values()):
                return
            delete_topics(config, [name])  # an old copy answered: try again
        except TopicNotFound:
            pass  # gone between the create and the offsets (see above): create it again
        except StokerError as e:
            cause = e.__cause__
            retriable = isinstance(cause, KafkaException) and cause.args[0].code() in (
                KafkaError.TOPIC_ALREADY_EXISTS, KafkaError.UNKNOWN_TOPIC_OR_PART)
            if not retriable and "exists with" not in str(e):
                raise
        if time.monotonic() > deadline:
            raise KafkaTimeout(f"topic {name!r} could not be recreated empty within {timeout:.0f}s")
        time.sleep(0.5)
