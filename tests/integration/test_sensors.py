"""Both Kafka sensors (and their triggers) against the real broker, with a consumer group at known offsets."""

from __future__ import annotations

import asyncio
import time

import pytest
from airflow.sdk.exceptions import AirflowFailException

from stoker.kafka import offsets as koffsets
from stoker.kafka import topics as ktopics
from stoker.run import records
from stoker.run.manifest import Manifest, PartitionRange, write_manifest
from stoker_airflow.sensors.kafka import KafkaLagSensor, KafkaPublishedSensor
from stoker_airflow.triggers.kafka import KafkaLagTrigger, KafkaPublishedTrigger

pytestmark = pytest.mark.integration
SEQ_LEN = 8


@pytest.fixture()
def published(kafka_config, tmp_path):
    """A topic with 5 + 3 committed sequences and the manifest that describes it."""
    from confluent_kafka import Producer

    topic = f"stoker.sensors.{time.time_ns()}.a1"
    ktopics.create_topic(kafka_config, topic, 2)
    producer = Producer({**kafka_config, "transactional.id": topic, "acks": "all"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i, part in enumerate([0] * 5 + [1] * 3):
        producer.produce(topic, key=records.make_key(0, i), partition=part,
                         value=records.encode_value(range(SEQ_LEN + 1), "uint16"),
                         headers=records.encode_headers("t/2026-12-01", "uint16"))
    producer.commit_transaction(30)
    ends = koffsets.stable_end_offsets(kafka_config, topic)
    m = Manifest(run_id="t/2026-12-01", corpus="t", ds="2026-12-01", topic=topic,
                 partitions=[PartitionRange(partition=0, start_offset=0, end_offset=ends[0], sequences=5),
                             PartitionRange(partition=1, start_offset=0, end_offset=ends[1], sequences=3)],
                 seq_len=SEQ_LEN, dtype="uint16", tokenizer_path="t.json", tokenizer_sha256="0" * 64,
                 vocab_size=16, docs_in=8, docs_kept=8, docs_dropped={}, tokens=72, padding_tokens=0,
                 sequences=8, source_uri="/x")
    write_manifest(tmp_path, m)
    yield m, str(tmp_path / "manifest.json")
    ktopics.delete_topics(kafka_config, [topic])


def _run(trigger):
    async def first():
        async for event in trigger.run():
            return event.payload
    return asyncio.run(asyncio.wait_for(first(), 60))


def test_published_sensor_and_trigger_match_the_manifest(published):
    m, path = published
    sensor = KafkaPublishedSensor(task_id="p", manifest_path=path)
    assert sensor.poke({}) is True
    assert sensor.execute({})["sequences"] == 8  # satisfied at once: no deferral

    event = _run(KafkaPublishedTrigger(topic=m.topic, expected={"0": m.partitions[0].end_offset,
                                                                "1": m.partitions[1].end_offset}))
    assert event["status"] == "published"
    ahead = _run(KafkaPublishedTrigger(topic=m.topic, expected={"0": 99, "1": 99}, poll_interval=0.2,
                                       deadline=time.time() + 1))
    assert ahead["status"] == "timeout" and ahead["expected"] == {"0": 99, "1": 99}
    with pytest.raises(AirflowFailException, match="!= manifest"):
        KafkaPublishedSensor(task_id="p", manifest_path=path).execute_complete({}, ahead)


def test_published_sensor_refuses_a_topic_holding_more_than_its_manifest(published, tmp_path_factory):
    m, _ = published
    smaller = Manifest(**{**m.to_dict(), "partitions": [
        PartitionRange(partition=0, start_offset=0, end_offset=2, sequences=1),
        PartitionRange(partition=1, start_offset=0, end_offset=1, sequences=1)], "sequences": 2})
    folder = tmp_path_factory.mktemp("smaller")
    write_manifest(folder, smaller)
    with pytest.raises(AirflowFailException, match="holds more than its manifest"):
        KafkaPublishedSensor(task_id="p", manifest_path=str(folder / "manifest.json")).poke({})


def test_lag_sensor_follows_a_consumer_group(kafka_config, published, caplog):
    m, path = published
    group = f"trainer-{time.time_ns()}"
    sensor = KafkaLagSensor(task_id="lag", manifest_path=path, group_id=group, poll_interval=0.2, timeout=2)
    assert sensor.poke({}) is False  # nothing committed: the whole run is lag
    koffsets.commit_offsets(kafka_config, group, m.topic, {0: 3, 1: 1})
    _m, report = sensor._report()
    assert [p.lag for p in report.partitions] == [m.partitions[0].end_offset - 3, m.partitions[1].end_offset - 1]
    assert report.lag_tokens == report.lag * SEQ_LEN

    timeout = _run(sensor._trigger())
    assert timeout["status"] == "timeout" and timeout["lag"] == report.lag
    with pytest.raises(AirflowFailException, match=f"consumer group {group} still lags"):
        sensor.execute_complete({}, timeout)

    koffsets.commit_offsets(kafka_config, group, m.topic, m.end_offsets())
    assert sensor.poke({}) is True
    done = _run(KafkaLagTrigger(topic=m.topic, group_id=group, end=m.end_offsets(), tokens_per_message=SEQ_LEN))
    assert done["status"] == "caught_up" and done["consumed_fraction"] == 1.0


def test_the_lag_trigger_hears_a_retention_raised_on_the_cluster(kafka_config, published):
    """The failure's advice ("raise the topic's retention.ms and clear") must work: the trigger reads the topic's
    live retention.ms, not the manifest's alone, and -1 (keep for ever) never expires. Before, a night whose
    manifest said 10 minutes failed at the first poll, whatever the cluster held."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    from stoker.kafka import clients

    m, _path = published
    group = f"trainer-{time.time_ns()}"
    published_at = "2026-01-01T00:00:00+00:00"  # long ago: 10 minutes of retention is over
    short = KafkaLagTrigger(topic=m.topic, group_id=group, end=m.end_offsets(), poll_interval=0.2,
                            created_at=published_at, retention_ms=600_000)
    assert ktopics.topic_config(kafka_config, m.topic, "retention.ms") == str(7 * 24 * 3600 * 1000)  # the broker's
    resource = ConfigResource(ResourceType.TOPIC, m.topic, incremental_configs=[
        ConfigEntry("retention.ms", "600000", incremental_operation=AlterConfigOpType.SET)])
    for fut in clients.admin(kafka_config).incremental_alter_configs([resource]).values():
        fut.result(timeout=30)
    assert _run(short)["status"] == "retention_expiring"  # the cluster says 10 minutes too: it fails

    resource = ConfigResource(ResourceType.TOPIC, m.topic, incremental_configs=[
        ConfigEntry("retention.ms", "-1", incremental_operation=AlterConfigOpType.SET)])
    for fut in clients.admin(kafka_config).incremental_alter_configs([resource]).values():
        fut.result(timeout=30)
    deadline = time.monotonic() + 30  # the broker applies an altered config asynchronously
    while ktopics.topic_config(kafka_config, m.topic, "retention.ms") != "-1" and time.monotonic() < deadline:
        time.sleep(0.2)
    heard = KafkaLagTrigger(topic=m.topic, group_id=group, end=m.end_offsets(), poll_interval=0.2,
                            created_at=published_at, retention_ms=600_000, deadline=time.time() + 3)
    assert _run(heard)["status"] == "timeout"  # waited for the trainer instead of failing on retention
    assert heard.retention_ms == -1
