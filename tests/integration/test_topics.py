"""Making a run's topics on the broker: ``recreate_topic`` leaves the name existing and empty whatever an
earlier run left under it, including when the name vanishes between its create and its check."""

from __future__ import annotations

import uuid

import pytest

from stoker.kafka import offsets as koffsets
from stoker.kafka import topics as ktopics
from stoker.kafka.clients import producer

pytestmark = pytest.mark.integration


def test_recreate_empties_a_topic_an_earlier_run_filled(kafka_config):
    topic = f"stoker.test.20261207.r{uuid.uuid4().hex[:8]}"
    ktopics.create_topic(kafka_config, topic, 2)
    p = producer(kafka_config)
    for i in range(5):
        p.produce(topic, value=b"old", partition=i % 2)
    assert p.flush(30) == 0
    assert sum(koffsets.end_offsets(kafka_config, topic, committed_only=False).values()) == 5
    koffsets.recreate_topic(kafka_config, topic, 3)
    assert koffsets.end_offsets(kafka_config, topic, committed_only=False) == {0: 0, 1: 0, 2: 0}
    ktopics.delete_topics(kafka_config, [topic])


def test_recreate_asks_again_when_the_name_vanishes_after_its_create(kafka_config, monkeypatch):
    """The create answers "already exists" for an old copy whose deletion the broker then finishes (or a
    broker that has not heard of the new topic answers the offsets' metadata): the offsets then find no
    such topic. Seen on the 3-node cluster, where it failed the publish job; replayed here on the broker by
    letting the first create report the old copy and then deleting it for real."""
    topic = f"stoker.test.20261207.v{uuid.uuid4().hex[:8]}"
    ktopics.create_topic(kafka_config, topic, 2)
    real, calls = koffsets.create_topic, []

    def create(config, name, *args, **kwargs):
        calls.append(name)
        if len(calls) == 1:
            ktopics.delete_topics(config, [name])  # the old copy's deletion finishes after the answer
            return False
        return real(config, name, *args, **kwargs)

    monkeypatch.setattr(koffsets, "create_topic", create)
    koffsets.recreate_topic(kafka_config, topic, 2)
    assert len(calls) == 2
    assert koffsets.end_offsets(kafka_config, topic, committed_only=False) == {0: 0, 1: 0}
    ktopics.delete_topics(kafka_config, [topic])
