"""docker-compose.yaml's Kafka cluster, run on real brokers without Docker: the three nodes' KAFKA_*
settings (as the apache/kafka image turns them into server.properties) start as three local
processes of the same Kafka release, with only host names and ports rewritten to 127.0.0.1. They
must form one KRaft quorum, give topics RF 3 and min.insync.replicas 2 by default, keep accepting
acks=all writes with one node down, and refuse them with two down."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stoker.kafka import clients
from stoker.kafka import topics as ktopics
from stoker.kafka.settings import with_password_file
from tests.support.kafka_cluster import ComposeCluster

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
    admin = clients.admin(client)
    # a topic created with the brokers' defaults (as the compose corpora's RF 3 asks)
    futures = admin.create_topics([NewTopic("compose.check", num_partitions=3)])
    futures["compose.check"].result(30)
    ktopics.await_topic(client, "compose.check", 3)  # every broker knows it (else UNKNOWN_TOPIC_OR_PART below)
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


def test_the_secure_profiles_kafka_serves_only_sasl_ssl_to_the_pipeline_user(tmp_path):
    """docker-compose.yaml's opt-in `secure` profile: its setup command makes the CA, certificate and
    password, the kafka-secure node's KAFKA_* settings start a broker, its users command grants the
    pipeline's user; then that user reaches its topics over SASL_SSL, with the password read from the
    file the connection names, and nothing else."""
    import re
    import subprocess
    import sys
    import time

    import yaml

    from stoker.exceptions import StokerError
    from stoker_local import broker as stack
    from stoker_local.servers import free_ports
    from tests.support.kafka_cluster import image_properties

    compose = yaml.safe_load((Path(__file__).resolve().parents[2] / "docker-compose.yaml").read_text())
    services = compose["services"]
    secrets_dir = tmp_path / "kafka-secure-tls"
    setup = services["kafka-secure-setup"]["command"][-1].split(" && ")[0].split()
    setup[setup.index("/var/lib/stoker-kafka-secure")] = str(secrets_dir)
    assert setup[:3] == ["python", "-m", "stoker_local.broker.secure"]
    subprocess.run([sys.executable, *setup[1:]], check=True, capture_output=True, timeout=120)

    base = free_ports(3)
    port = {"9096": base, "9097": base + 1, "9098": base + 2}
    env = {k: str(v) for k, v in services["kafka-secure"]["environment"].items()}
    props = image_properties(env)
    for key in ("listeners", "advertised.listeners", "controller.quorum.voters"):
        props[key] = re.sub(r"(kafka-secure)?:(909\d)", lambda m: f"127.0.0.1:{port[m.group(2)]}", props[key])
    for key in ("ssl.keystore.location", "ssl.truststore.location"):
        props[key] = props[key].replace("/etc/stoker-kafka", str(secrets_dir))
    props["log.dirs"] = str(tmp_path / "data")
    cfg = tmp_path / "server.properties"
    cfg.write_text("".join(f"{k}={v}\n" for k, v in sorted(props.items())))
    jvm = [stack._java(), "-Xmx256m", f"-Dlog4j2.configurationFile={stack._log4j_config()}",
           f"-Dkafka.logs.dir={tmp_path / 'logs'}", "-cp", stack._classpath()]
    subprocess.run([*jvm, "kafka.tools.StorageTool", "format", f"--cluster-id={env['CLUSTER_ID']}", "-c", str(cfg)],
                   check=True, capture_output=True, timeout=120)
    proc = subprocess.Popen([*jvm, "kafka.Kafka", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        grant = services["kafka-secure-users"]["command"]
        grant = [str(secrets_dir) if a == "/var/lib/stoker-kafka-secure" else a for a in grant]
        grant[-1] = f"127.0.0.1:{port['9098']}"  # kafka-secure:9098, its INTERNAL (mutual TLS) listener
        deadline = time.monotonic() + 120
        while subprocess.run([sys.executable, *grant[1:]], capture_output=True, timeout=120).returncode != 0:
            assert proc.poll() is None and time.monotonic() < deadline, "the secure node never took the grant"
            time.sleep(2)
        client = with_password_file({
            "bootstrap.servers": f"127.0.0.1:{port['9096']}", "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "stoker",
            "sasl.password.file": str(secrets_dir / "credentials.json"),
            "ssl.ca.location": str(secrets_dir / "tls" / "ca.pem")})
        assert ktopics.check_reachable(client, timeout=30) == 1
        ktopics.create_topic(client, "stoker.compose.secure", 1)
        with pytest.raises(StokerError, match="TOPIC_AUTHORIZATION_FAILED"):
            ktopics.create_topic(client, "other.topic", 1)
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
