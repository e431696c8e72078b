"""docker-compose.yaml's Kafka cluster, run on real brokers without Docker: the three nodes' KAFKA_*
settings (as the apache/kafka image turns them into server.properties) start as three local
processes of the same Kafka release, with only host names and ports rewritten to 127.0.0.1. They
must form one KRaft quorum, give topics RF 3 and min.insync.replicas 2 by default, keep accepting
acks=all writes with one node down, and refuse them with two down."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from stoker import kafka as skafka
from stoker.local import broker as stack

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
NODES = ["kafka-1", "kafka-2", "kafka-3"]
HOME = Path(os.environ["STOKER_HOME"]) / "compose-kafka"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def image_properties(env: dict[str, str]) -> dict[str, str]:
    """The apache/kafka image's rule: KAFKA_FOO_BAR → foo.bar (``__`` → ``_``, ``___`` → ``-``)."""
    out = {}
    for k, v in env.items():
        if k.startswith("KAFKA_"):
            key = k.removeprefix("KAFKA_").replace("___", "-").replace("__", "\0").replace("_", ".").replace("\0", "_")
            out[key.lower()] = str(v)
    return out


def localised(compose: dict) -> tuple[dict[str, dict[str, str]], dict[str, str], str]:
    """Each node's properties with ``<host>:<port>`` of the compose network mapped to free local ports."""
    ports: dict[tuple[str, str], int] = {}

    def local(host: str, port: str) -> str:
        return f"127.0.0.1:{ports.setdefault((host, port), _free_port())}"

    props, cluster_ids = {}, set()
    for name in NODES:
        env = {k: str(v) for k, v in compose["services"][name]["environment"].items()}
        cluster_ids.add(env["CLUSTER_ID"])
        p = image_properties(env)
        p["controller.quorum.voters"] = ",".join(
            f"{v.split('@')[0]}@{local(*v.split('@')[1].split(':'))}" for v in p["controller.quorum.voters"].split(","))
        # listeners bind ``:port`` on the node; locally each node gets its own ports on 127.0.0.1
        p["listeners"] = ",".join(f"{lname}://{local(name, addr.rsplit(':', 1)[1])}"
                                  for lname, addr in (x.split("://") for x in p["listeners"].split(",")))
        p["advertised.listeners"] = ",".join(
            f"{lname}://{local(name, addr.rsplit(':', 1)[1])}"
            for lname, addr in (x.split("://") for x in p["advertised.listeners"].split(",")))
        p["log.dirs"] = str(HOME / name / "data")
        props[name] = p
    assert len(cluster_ids) == 1
    internal = ",".join(local(n, "9092") for n in NODES)
    return props, {"bootstrap.servers": internal}, cluster_ids.pop()


@pytest.fixture(scope="module")
def cluster():
    import shutil

    compose = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
    props, client, cluster_id = localised(compose)
    if HOME.exists():
        shutil.rmtree(HOME)
    procs: dict[str, subprocess.Popen] = {}
    java, cp, log4j = stack._java(), stack._classpath(), stack._log4j_config()
    try:
        for name, p in props.items():
            home = HOME / name
            (home / "logs").mkdir(parents=True)
            cfg = home / "server.properties"
            cfg.write_text("".join(f"{k}={v}\n" for k, v in sorted(p.items())))
            jvm = [java, "-Xmx256m", f"-Dlog4j2.configurationFile={log4j}", f"-Dkafka.logs.dir={home / 'logs'}",
                   "-cp", cp]
            fmt = subprocess.run([*jvm, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}",
                                  "-c", str(cfg)],
                                 capture_output=True, text=True, timeout=120)
            assert fmt.returncode == 0, f"{name}: storage format refused the settings:\n{fmt.stdout}{fmt.stderr}"
            with open(home / "logs" / "stdout.log", "wb") as out:
                procs[name] = subprocess.Popen([*jvm, "kafka.Kafka", str(cfg)], stdout=out, stderr=subprocess.STDOUT,
                                               start_new_session=True)
        deadline = time.monotonic() + 120
        while True:
            try:
                md = skafka.admin(client).list_topics(timeout=5)
                if len(md.brokers) == 3:
                    break
            except Exception:  # noqa: BLE001 - the quorum is still forming
                pass
            dead = [n for n, pr in procs.items() if pr.poll() is not None]
            assert not dead, f"{dead} exited: see {HOME}/<node>/logs"
            assert time.monotonic() < deadline, f"the 3 nodes did not form a cluster in 120s: see {HOME}/<node>/logs"
            time.sleep(1)
        yield client, procs
    finally:
        for pr in procs.values():
            if pr.poll() is None:
                os.killpg(pr.pid, signal.SIGKILL)
                pr.wait()


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

    client, procs = cluster
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
    os.killpg(procs["kafka-3"].pid, signal.SIGKILL)
    procs["kafka-3"].wait()
    assert _produce(client, "compose.check", 100, timeout_ms=60_000) == []
    # two down: fewer than min.insync.replicas, every acks=all write is refused
    os.killpg(procs["kafka-2"].pid, signal.SIGKILL)
    procs["kafka-2"].wait()
    errors = _produce(client, "compose.check", 5, timeout_ms=8_000)
    assert len(errors) == 5 and set(errors) <= {"NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
                                                "_MSG_TIMED_OUT", "REQUEST_TIMED_OUT"}, errors
