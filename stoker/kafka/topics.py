"""Topics of a cluster: reachable, listed, created, awaited and deleted (offsets are :mod:`stoker.kafka.offsets`,
the lag arithmetic the sensors and the trainer share is :mod:`stoker.kafka.lag`).

A *client config* is a plain librdkafka dict (``{"bootstrap.servers": ..., "security.protocol": ...}``):
Airflow's ``kafka_default`` connection holds exactly that in its extra, so any cluster (SASL/SSL
included) is chosen by connection, not by code.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from stoker.exceptions import KafkaTimeout, StokerError
from stoker.kafka.clients import admin

TIMEOUT_S = 15.0


def _wait(futures: Mapping[Any, Any], what: str, timeout: float = TIMEOUT_S) -> dict[Any, Any]:
    out = {}
    for key, fut in futures.items():
        try:
            out[key] = fut.result(timeout=timeout)
        except Exception as e:  # confluent_kafka raises KafkaException with a KafkaError inside
            raise StokerError(f"{what} {key!r} failed: {e}") from e
    return out


def check_reachable(config: Mapping[str, Any], timeout: float = 10.0) -> int:
    """Number of brokers; raises a clear error when none answers within ``timeout`` seconds, and at
    once (not at the timeout) when the cluster refuses the credentials or the client does not trust
    its certificate."""
    from confluent_kafka import KafkaException

    errors: list[Any] = []
    user_cb = config.get("error_cb")

    def on_error(err: Any) -> None:
        errors.append(err)
        if callable(user_cb):
            user_cb(err)

    client = admin({**config, "error_cb": on_error})
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            return len(client.list_topics(timeout=min(1.0, max(0.1, deadline - time.monotonic()))).brokers)
        except KafkaException as e:
            last = e
        client.poll(0)  # serves error_cb
        refused = next((why for why in map(lambda err: _refusal(err, config), errors) if why), None)
        if refused:
            raise StokerError(refused) from None
        if time.monotonic() >= deadline:
            raise StokerError(
                f"Kafka at {config.get('bootstrap.servers')!r} did not answer within {timeout:.0f}s ({last}): "
                "start it with `stoker kafka up` or fix the kafka_default connection"
            ) from None


def _refusal(err: Any, config: Mapping[str, Any]) -> str | None:
    """A librdkafka error that no waiting fixes (bad credentials, an untrusted certificate), in words."""
    from confluent_kafka import KafkaError

    text, where = str(err.str()), config.get("bootstrap.servers")
    if err.code() == KafkaError._AUTHENTICATION and "SSL" not in text:
        return (f"Kafka at {where!r} refused the credentials of user {config.get('sasl.username')!r} "
                f"({config.get('sasl.mechanism')}): {text}. Fix sasl.username / sasl.password in the kafka_default "
                "connection (the local secure broker's are in .stoker/kafka/credentials.json)")
    if "certificate verify failed" in text or ("SSL" in text and "handshake" in text):
        return (f"Kafka at {where!r}: TLS handshake failed, this client does not trust the broker's certificate "
                f"(ssl.ca.location = {config.get('ssl.ca.location')!r}): {text}. Set ssl.ca.location to the CA "
                "that signed it (the local secure broker's is .stoker/kafka/tls/ca.pem)")
    return None


def topic_partitions(config: Mapping[str, Any], topic: str) -> int | None:
    """Partition count of ``topic``, or None when it does not exist. Another error (LEADER_NOT_AVAILABLE while
    a killed broker's leaders move) is asked again for up to TIMEOUT_S, never taken for "does not exist"."""
    from confluent_kafka import KafkaError

    deadline = time.monotonic() + TIMEOUT_S
    while (t := admin(config).list_topics(topic=topic, timeout=TIMEOUT_S).topics.get(topic)) is not None and (
            t.error is not None and t.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART):
        if time.monotonic() > deadline:
            raise StokerError(f"topic {topic!r}: its metadata still answers {t.error} after {TIMEOUT_S:.0f}s")
        time.sleep(0.3)
    return None if t is None or t.error is not None else len(t.partitions)


def topic_config(config: Mapping[str, Any], topic: str, name: str) -> str | None:
    """The live value of one of ``topic``'s configs (``retention.ms``) as the broker holds it now: a person who
    raised it on the cluster is heard; None when the topic or the config is not there."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    resource = ConfigResource(ResourceType.TOPIC, topic)
    try:
        found = _wait(admin(config).describe_configs([resource], request_timeout=TIMEOUT_S), "describe_configs")
    except StokerError:
        return None
    entry = next(iter(found.values())).get(name)
    return None if entry is None else str(entry.value)


def list_topics(config: Mapping[str, Any], prefix: str = "") -> list[str]:
    return sorted(t for t in admin(config).list_topics(timeout=TIMEOUT_S).topics if t.startswith(prefix))


def create_topic(
    config: Mapping[str, Any],
    name: str,
    partitions: int,
    replication_factor: int = 1,
    topic_config: Mapping[str, str] | None = None,
) -> bool:
    """Create ``name``; True if created, False if it already existed with the same partition count."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    new = NewTopic(name, num_partitions=partitions, replication_factor=replication_factor,
                   config=dict(topic_config or {}))
    client = admin(config)  # must outlive the future: a destroyed handle fails it
    fut = client.create_topics([new], operation_timeout=TIMEOUT_S)[name]
    try:
        fut.result(timeout=TIMEOUT_S * 2)
    except KafkaException as e:
        if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise StokerError(
                f"creating topic {name!r} ({partitions} partitions, RF {replication_factor}) failed: {e}") from e
        have = topic_partitions(config, name)
        if have != partitions:
            raise StokerError(
                f"topic {name!r} exists with {have} partitions, expected {partitions}: delete it first") from e
        return False
    await_topic(config, name, partitions)
    return True


def await_topic(config: Mapping[str, Any], name: str, partitions: int, timeout: float = 30.0) -> None:
    """Metadata propagates asynchronously: wait until every broker of the cluster knows the topic with a
    leader for every partition (one that does not yet answers UNKNOWN_TOPIC_OR_PART, e.g. to a
    describe_configs or a produce routed to it)."""
    deadline = time.monotonic() + timeout
    first = admin(config)
    brokers = {b.id: f"{b.host}:{b.port}" for b in first.list_topics(timeout=TIMEOUT_S).brokers.values()}
    clients = {bid: admin({**config, "bootstrap.servers": addr}) for bid, addr in brokers.items()} or {-1: first}
    waiting = set(clients)
    while waiting and time.monotonic() < deadline:
        for bid in sorted(waiting):
            try:
                t = clients[bid].list_topics(topic=name, timeout=TIMEOUT_S).topics.get(name)
            except Exception:  # noqa: BLE001 - a broker that does not answer yet: ask again
                continue
            if t is not None and t.error is None and len(t.partitions) == partitions and all(
                p.leader >= 0 for p in t.partitions.values()
            ):
                waiting.discard(bid)
        if waiting:
            time.sleep(0.2)
    if waiting:
        late = ", ".join(f"{b} at {brokers.get(b, '?')}" for b in sorted(waiting))
        raise KafkaTimeout(f"topic {name!r}: brokers {late} did not know it with a leader for every partition "
                           f"after {timeout:.0f}s")


def delete_topics(config: Mapping[str, Any], names: Iterable[str]) -> list[str]:
    """Delete topics that exist; returns those deleted."""
    from confluent_kafka import KafkaError, KafkaException

    names = [n for n in names]
    if not names:
        return []
    client = admin(config)
    futures = client.delete_topics(names, operation_timeout=TIMEOUT_S)
    deleted = []
    for name, fut in futures.items():
        try:
            fut.result(timeout=TIMEOUT_S * 2)
            deleted.append(name)
        except KafkaException as e:
            if e.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise StokerError(f"deleting topic {name!r} failed: {e}") from e
    deadline = time.monotonic() + 30.0
    while any(t in deleted for t in list_topics(config)):  # deletion is asynchronous: wait it out
        if time.monotonic() > deadline:
            raise KafkaTimeout(f"topics {deleted} still listed 30s after deletion")
        time.sleep(0.2)
    return deleted
