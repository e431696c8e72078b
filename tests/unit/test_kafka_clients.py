"""Kafka clients are made from named settings, and one AdminClient per cluster config is reused: a
trigger polling for hours, or a 0.2 s wait loop, must not open a connection per call."""

from __future__ import annotations

import os

import pytest

from stoker.kafka import clients as kafka_clients

pytestmark = pytest.mark.unit

NOWHERE = {"bootstrap.servers": "127.0.0.1:9", "log_level": 0}  # never contacted: clients connect lazily


def test_one_admin_client_per_cluster_config_is_reused():
    first = kafka_clients.admin(NOWHERE)
    assert kafka_clients.admin(dict(NOWHERE)) is first
    assert kafka_clients.admin({**NOWHERE, "client.id": "other"}) is not first
    with_callback = {**NOWHERE, "error_cb": lambda err: None}  # its own client: the callback is the caller's
    assert kafka_clients.admin(with_callback) is not kafka_clients.admin(with_callback)


def test_an_idle_admin_client_is_closed_and_a_forked_child_makes_its_own(monkeypatch):
    first = kafka_clients.admin(NOWHERE)
    monkeypatch.setattr(kafka_clients, "ADMIN_IDLE_S", -1.0)
    assert kafka_clients.admin(NOWHERE) is not first  # idle past the limit: dropped, a new one made
    monkeypatch.setattr(kafka_clients, "ADMIN_IDLE_S", 120.0)
    kept = kafka_clients.admin(NOWHERE)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child must not use the parent's librdkafka handle (its threads did not fork)
        os.write(write, b"1" if kafka_clients.admin(NOWHERE) is not kept else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"


def test_a_stopped_clusters_clients_are_forgotten_and_the_others_kept():
    gone, other = kafka_clients.admin(NOWHERE), kafka_clients.admin({**NOWHERE, "bootstrap.servers": "127.0.0.1:7"})
    assert kafka_clients.forget_admins("127.0.0.1:9") == 1
    assert kafka_clients.admin(NOWHERE) is not gone  # a new client, should the cluster be asked again
    assert kafka_clients.admin({**NOWHERE, "bootstrap.servers": "127.0.0.1:7"}) is other


def test_each_kind_of_client_is_spelled_once():
    reader = kafka_clients.client_config(NOWHERE, kafka_clients.Role.READER, **{"group.id": "g"})
    assert reader["isolation.level"] == "read_committed" and reader["enable.auto.commit"] is False
    trainer = kafka_clients.client_config(NOWHERE, kafka_clients.Role.TRAINER)
    assert trainer["auto.offset.reset"] == "error"  # a position out of range is an error, never a reset
    publisher = kafka_clients.client_config(NOWHERE, kafka_clients.Role.PUBLISHER, **{"transactional.id": "t"})
    assert publisher["enable.idempotence"] is True and publisher["acks"] == "all"
    assert kafka_clients.client_config({**NOWHERE, "acks": "1"}, kafka_clients.Role.PUBLISHER)["acks"] == "all"


@pytest.mark.parametrize("code", ["UNKNOWN_LEADER_EPOCH", "FENCED_LEADER_EPOCH", "NOT_LEADER_FOR_PARTITION",
                                  "LEADER_NOT_AVAILABLE", "UNKNOWN_TOPIC_OR_PART", "_NOENT"])
def test_list_offsets_asks_again_while_a_partitions_leadership_settles(code):
    # a topic just made on a 3-node cluster answered list_offsets with UNKNOWN_LEADER_EPOCH and failed a publish;
    # another answered with librdkafka's own _NOENT ("Failed to query partition leaders: No leaders found")
    from confluent_kafka import KafkaError, KafkaException

    from stoker.exceptions import StokerError
    from stoker.kafka import offsets as koffsets

    def failed(c: int) -> StokerError:
        try:
            raise StokerError("list_offsets failed") from KafkaException(KafkaError(c))
        except StokerError as e:
            return e

    assert koffsets._retriable(failed(getattr(KafkaError, code)))
    assert not koffsets._retriable(failed(KafkaError.TOPIC_AUTHORIZATION_FAILED))


def test_a_topics_transient_metadata_error_is_asked_again_and_only_unknown_means_absent(monkeypatch):
    # a publish task whose partition leader had just been killed read LEADER_NOT_AVAILABLE on the topic as
    # "topic does not exist" and failed
    from types import SimpleNamespace

    from confluent_kafka import KafkaError

    from stoker.kafka import topics as ktopics

    answers = [KafkaError(KafkaError.LEADER_NOT_AVAILABLE), None, KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)]

    def list_topics(topic: str, timeout: float) -> SimpleNamespace:
        return SimpleNamespace(topics={topic: SimpleNamespace(error=answers.pop(0), partitions={0: 0, 1: 1})})

    monkeypatch.setattr(ktopics, "admin", lambda config: SimpleNamespace(list_topics=list_topics))
    monkeypatch.setattr(ktopics.time, "sleep", lambda s: None)
    assert ktopics.topic_partitions(NOWHERE, "t") == 2  # asked again past the settling leader
    assert ktopics.topic_partitions(NOWHERE, "t") is None and not answers
