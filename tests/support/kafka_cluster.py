"""docker-compose.yaml's Kafka cluster, run on real brokers without Docker: the three nodes' KAFKA_*
settings (as the apache/kafka image turns them into server.properties) start as three local
processes of the same Kafka release, with only host names and ports rewritten to 127.0.0.1.

Used by tests/integration/test_compose_kafka.py (the file's settings form a cluster) and by the
fault suite (tests/faults: brokers killed under a publish and under training)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from stoker.kafka import clients
from stoker_local import broker as stack
from stoker_local.servers import free_ports

REPO = Path(__file__).resolve().parents[2]
NODES = ["kafka-1", "kafka-2", "kafka-3"]


def image_properties(env: dict[str, str]) -> dict[str, str]:
    """The apache/kafka image's rule: KAFKA_FOO_BAR → foo.bar (``__`` → ``_``, ``___`` → ``-``)."""
    out = {}
    for k, v in env.items():
        if k.startswith("KAFKA_"):
            key = k.removeprefix("KAFKA_").replace("___", "-").replace("__", "\0").replace("_", ".").replace("\0", "_")
            out[key.lower()] = str(v)
    return out


def localised(compose: dict, home: Path) -> tuple[dict[str, dict[str, str]], dict[str, str], str]:
    """Each node's properties with ``<host>:<port>`` of the compose network mapped to free local ports."""
    ports: dict[tuple[str, str], int] = {}
    base = free_ports(12)

    def local(host: str, port: str) -> str:
        return f"127.0.0.1:{ports.setdefault((host, port), base + len(ports))}"

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
        p["log.dirs"] = str(home / name / "data")
        props[name] = p
    assert len(cluster_ids) == 1
    internal = ",".join(local(n, "9092") for n in NODES)
    return props, {"bootstrap.servers": internal}, cluster_ids.pop()


class ComposeCluster:
    """The three nodes (each controller and broker) as local processes; nodes can be killed (SIGKILL)
    and started again on their data."""

    def __init__(self, home: Path, faulty: bool = False) -> None:
        self.home = home
        compose = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
        self.props, self.client, self.cluster_id = localised(compose, home)
        self.proxy_routes: dict[int, tuple[str, int]] = {}
        """``faulty``: each node's ``FAULTY`` listener, by the proxy port it advertises
        (tests/support/fault_proxy.py)."""
        self.faulty_client: dict[str, str] = {}
        """A client config that reaches every broker only through the proxy (``faulty``)."""
        if faulty:
            taken = {int(port) for props in self.props.values() for value in props.values()
                     for port in re.findall(r"127\.0\.0\.1:(\d+)", value)}
            base = free_ports(2 * len(NODES))
            while taken & set(range(base, base + 2 * len(NODES))):  # not yet bound: free_ports cannot see them
                base = free_ports(2 * len(NODES))
            for i, name in enumerate(NODES):
                p, bind, proxy = self.props[name], base + 2 * i, base + 2 * i + 1
                p["listeners"] += f",FAULTY://127.0.0.1:{bind}"
                p["advertised.listeners"] += f",FAULTY://127.0.0.1:{proxy}"
                p["listener.security.protocol.map"] += ",FAULTY:PLAINTEXT"
                self.proxy_routes[proxy] = ("127.0.0.1", bind)
            self.faulty_client = {"bootstrap.servers": ",".join(f"127.0.0.1:{port}" for port in self.proxy_routes)}
        self.procs: dict[str, subprocess.Popen] = {}
        self.ids = {int(p["node.id"]): name for name, p in self.props.items()}

    def _jvm(self, name: str) -> list[str]:
        logs = self.home / name / "logs"
        return [stack._java(), "-Xmx256m", f"-Dlog4j2.configurationFile={stack._log4j_config()}",
                f"-Dkafka.logs.dir={logs}", "-cp", stack._classpath()]

    def start(self, timeout: float = 120) -> ComposeCluster:
        if self.home.exists():
            shutil.rmtree(self.home)
        for name, p in self.props.items():
            home = self.home / name
            (home / "logs").mkdir(parents=True)
            cfg = home / "server.properties"
            cfg.write_text("".join(f"{k}={v}\n" for k, v in sorted(p.items())))
            fmt = subprocess.run([*self._jvm(name), "kafka.tools.StorageTool", "format",
                                  f"--cluster-id={self.cluster_id}", "-c", str(cfg)],
                                 capture_output=True, text=True, timeout=120)
            assert fmt.returncode == 0, f"{name}: storage format refused the settings:\n{fmt.stdout}{fmt.stderr}"
            self.start_node(name)
        self.await_brokers(3, timeout)
        return self

    def start_node(self, name: str) -> None:
        home = self.home / name
        with open(home / "logs" / "stdout.log", "ab") as out:
            self.procs[name] = subprocess.Popen([*self._jvm(name), "kafka.Kafka", str(home / "server.properties")],
                                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def await_brokers(self, n: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if len(clients.admin(self.client).list_topics(timeout=5).brokers) == n:
                    return
            except Exception:  # noqa: BLE001 - the quorum is still forming
                pass
            dead = [n for n, pr in self.procs.items() if pr.poll() is not None]
            assert not dead, f"{dead} exited: see {self.home}/<node>/logs"
            assert time.monotonic() < deadline, f"{n} brokers did not form a cluster in {timeout}s: see {self.home}"
            time.sleep(1)

    def kill(self, name: str) -> None:
        """SIGKILL the node's JVM: no controlled shutdown, no leader hand-over."""
        os.killpg(self.procs[name].pid, signal.SIGKILL)
        self.procs[name].wait()

    def restart(self, name: str) -> None:
        """Start a killed node again and wait until every partition has its replicas back in sync."""
        self.start_node(name)
        self.await_brokers(3)
        deadline = time.monotonic() + 120
        while not self.fully_replicated():
            assert time.monotonic() < deadline, "the restarted node did not rejoin every ISR in 120s"
            time.sleep(1)

    def fully_replicated(self) -> bool:
        md = clients.admin(self.client).list_topics(timeout=10)
        return all(len(p.isrs) == len(p.replicas) for t in md.topics.values() for p in t.partitions.values())

    def leader(self, topic: str, partition: int = 0) -> str:
        """The node that leads ``topic``'s partition."""
        md = clients.admin(self.client).list_topics(topic, timeout=10)
        return self.ids[md.topics[topic].partitions[partition].leader]

    def coordinator(self, key: str, internal_topic: str) -> str:
        """The node that coordinates a transactional id (``__transaction_state``) or a consumer group
        (``__consumer_offsets``): the leader of the partition Kafka hashes ``key`` to."""
        md = clients.admin(self.client).list_topics(internal_topic, timeout=10)
        return self.leader(internal_topic, _java_abs(_java_hash(key)) % len(md.topics[internal_topic].partitions))

    def stop(self) -> None:
        from stoker.kafka.clients import forget_admins

        forget_admins(self.client["bootstrap.servers"])  # else they reconnect to the stopped nodes until the end
        for pr in self.procs.values():
            if pr.poll() is None:
                os.killpg(pr.pid, signal.SIGKILL)
                pr.wait()

    def describe(self) -> dict[str, Any]:
        return {"bootstrap": self.client["bootstrap.servers"],
                "alive": [n for n, p in self.procs.items() if p.poll() is None]}


def _java_hash(s: str) -> int:
    """``String.hashCode()`` (UTF-16 code units, 32-bit overflow)."""
    h = 0
    for unit in s.encode("utf-16-be").hex(" ", 2).split():
        h = (31 * h + int(unit, 16)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def _java_abs(n: int) -> int:
    """Kafka's ``Utils.abs``: ``Integer.MIN_VALUE`` maps to 0."""
    return 0 if n == -(1 << 31) else abs(n)
