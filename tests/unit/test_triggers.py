"""Every trigger survives the triggerer's serialise → import-by-classpath → rebuild round trip."""

import importlib

import pytest

from stoker_airflow.triggers import KafkaLagTrigger, KafkaPublishedTrigger

pytestmark = pytest.mark.unit


def _rebuild(trigger):
    classpath, kwargs = trigger.serialize()
    module, name = classpath.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    return cls(**kwargs), kwargs


@pytest.mark.parametrize(
    "trigger",
    [
        KafkaPublishedTrigger(topic="stoker.s.20261201.a1", expected={0: 12, "1": 9}, kafka_config_id="k",
                              poll_interval=3.0, deadline=1e9),
        KafkaLagTrigger(topic="stoker.s.20261201.a1", group_id="g", end={0: 10, 1: 11}, start={0: 0, 1: 1},
                        max_lag=2, tokens_per_message=256, kafka_config_id="k", poll_interval=7.0, deadline=2e9),
    ],
)
def test_serialize_round_trip(trigger):
    rebuilt, kwargs = _rebuild(trigger)
    assert type(rebuilt) is type(trigger)
    assert rebuilt.serialize() == trigger.serialize()
    assert all(isinstance(k, str) for v in kwargs.values() if isinstance(v, dict) for k in v)  # JSON-safe keys
