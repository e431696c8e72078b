"""docker-compose.yaml's Kafka cluster, run on real brokers without Docker: the three nodes' KAFKA_*
settings (as the apache/kafka image turns them into server.properties) start as three local
processes of the same Kafka release, with only host names and ports rewritten to 127.0.0.1. They
must form one KRaft quorum, give topics RF 3 and min.insync.replicas 2 by default, keep accepting
acks=all writes with one node down, and refuse them with two down."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kafka_cluster import ComposeCluster  # tests/kafka_cluster.py

from stoker import kafka as skafka

pytestmark = pytest.mark.integration
HOME = Path(os.environ["STOKER_HOME"]) / "compose-kafka"


@pytest.fixture(scope="module")
def cluster():
    c = ComposeCluster(HOME)
    try:
        yield c.start()
    finally:
        c.stop()


def _produce(client: dict[str, str], topic: str, n: int, timeout_ms: int = 20_000) -> list[str]:
    """acks=all through the idempotent producer, as the pipeline publishes; returns the delivery errors."""
    from confluent_kafka import Producer

    errors: list[str] = []
    producer = Producer({**client, "acks": "all", "enable.idempotence": True, "message.timeout.ms": timeout_ms})
    for i in range(n):
        producer.produce(topic, key=f"k{i}".encode(), value=b"x" * 64,
                         on_delivery=lambda err, _m: errors.append(err.name()) if err else None)
    producer.flush(timeout_ms / 1000 + 10)
    return errors


def test_the_compose_kafka_cluster_replicates_and_enforces_min_isr(cluster):
    from confluent_kafka.admin import ConfigResource, NewTopic

    client = cluster.client
    admin = skafka.admin(client)
    # a topic created with the brokers' defaults (as the compose corpora's RF 3 asks)
    futures = admin.create_topics([NewTopic("compose.check", num_partitions=3)])
    futures["compose.check"].result(30)
    md = admin.list_topics("compose.check", timeout=10).topics["compose.check"]
    assert all(len(p.replicas) == 3 for p in md.partitions.values())
    res = ConfigResource(ConfigResource.Type.TOPIC, "compose.check")
    config = admin.describe_configs([res])[res].result(30)
    assert config["min.insync.replicas"].value == "2"
    assert _produce(client, "compose.check", 100) == []

    # one node down: 2 replicas in sync, writes with acks=all still succeed
    cluster.kill("kafka-3")
    assert _produce(client, "compose.check", 100, timeout_ms=60_000) == []
    # two down: fewer than min.insync.replicas, every acks=all write is refused
    cluster.kill("kafka-2")
    errors = _produce(client, "compose.check", 5, timeout_ms=8_000)
    assert len(errors) == 5 and set(errors) <= {"NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
                                                "_MSG_TIMED_OUT", "REQUEST_TIMED_OUT"}, errors
