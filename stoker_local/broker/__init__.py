"""The embedded stack: a single-node Apache Kafka broker (KRaft, combined controller+broker).

The broker is Apache Kafka itself, from the jars ``make setup`` resolved from Maven Central
(stoker_local/broker/pom.xml) into the per-user cache. Its data, config, log and pid file live under
``<state>/kafka``. ``up`` is idempotent and waits until the broker answers; ``down`` stops exactly
the process ``up`` started (its pid *and* start time, :mod:`stoker.process`), whole process group
included.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from stoker import paths
from stoker.exceptions import StackError
from stoker.process import ProcessRecord

KAFKA_VERSION = "4.1.1"
DEFAULT_PORT = 29092


def kafka_libs() -> Path:
    return paths.cache_dir() / f"kafka-{KAFKA_VERSION}" / "libs"


@dataclass(frozen=True, slots=True)
class Broker:
    home: Path
    port: int = DEFAULT_PORT
    secure: bool = False
    """SASL_SSL (SCRAM-SHA-512 user ``stoker``, TLS, ACLs) instead of PLAINTEXT: see :mod:`.secure`."""

    @property
    def controller_port(self) -> int:
        return self.port + 1

    @property
    def internal_port(self) -> int:
        """The secure broker's mTLS listener (inter-broker, and its own admin identity)."""
        return self.port + 2

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def process(self) -> ProcessRecord:
        return ProcessRecord(self.home / "broker.pid")

    @property
    def config_file(self) -> Path:
        return self.home / "server.properties"

    @property
    def log_dir(self) -> Path:
        return self.home / "logs"

    def client_config(self) -> dict[str, str]:
        if self.secure:
            from stoker_local.broker import secure

            return secure.client_config(self.port, self.home)
        return {"bootstrap.servers": self.bootstrap}


def default_broker(secure: bool | None = None) -> Broker:
    """The stack's broker: ``STOKER_KAFKA_PORT``; secure as asked, else as it was started (its TLS folder)."""
    home = paths.state_dir() / "kafka"
    if secure is None:
        secure = (home / "tls" / "broker.pem").exists() and (home / "secure").exists()
    return Broker(home=home, port=int(os.environ.get("STOKER_KAFKA_PORT", DEFAULT_PORT)), secure=secure)


def _listeners(b: Broker) -> list[str]:
    if b.secure:
        from stoker_local.broker import secure

        return secure.server_properties(b.port, b.controller_port, b.internal_port, secure.make_certificates(b.home))
    return [f"listeners=PLAINTEXT://127.0.0.1:{b.port},CONTROLLER://127.0.0.1:{b.controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{b.port}",
            "controller.listener.names=CONTROLLER",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "inter.broker.listener.name=PLAINTEXT"]


def _server_properties(b: Broker) -> str:
    return "\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@127.0.0.1:{b.controller_port}",
        *_listeners(b),
        f"log.dirs={b.home / 'data'}",
        # one node: internal topics cannot be replicated
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=4",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "transaction.state.log.num.partitions=4",
        "transaction.max.timeout.ms=900000",
        "group.initial.rebalance.delay.ms=0",
        "num.partitions=1",
        "auto.create.topics.enable=false",
        "delete.topic.enable=true",
        "",
    ])


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise StackError("java not found: install a JDK 17+ (Debian: apt-get install openjdk-17-jre-headless)")
    return java


def _classpath() -> str:
    libs = kafka_libs()
    if not (libs.parent / ".complete").exists():
        raise StackError(f"Kafka {KAFKA_VERSION} jars are missing in {libs}: run `make setup`")
    return f"{libs}/*"


def tool_command(main_class: str, *args: str) -> list[str]:
    """The command line of one of Kafka's own tools (``org.apache.kafka.tools.ProducerPerformance``,
    ``...ConsumerGroupCommand``, ``...GetOffsetShell``): clients independent of Stoker's code."""
    logs = paths.state_dir() / "kafka-tools"
    logs.mkdir(parents=True, exist_ok=True)
    return [_java(), "-Xmx512m", "-cp", _classpath(), f"-Dlog4j2.configurationFile={_log4j_config()}",
            f"-Dkafka.logs.dir={logs}", main_class, *args]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Something listens on ``host:port``."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _format_storage(b: Broker, cluster_id: str | None = None) -> None:
    if (b.home / "data" / "meta.properties").exists():
        return
    cluster_id = cluster_id or base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    cmd = [_java(), "-cp", _classpath(), f"-Dlog4j2.configurationFile={_log4j_config()}",
           f"-Dkafka.logs.dir={b.log_dir}", "kafka.tools.StorageTool", "format",
           f"--cluster-id={cluster_id}", "-c", str(b.config_file)]  # `=`: an id may start with '-'
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        raise StackError(f"formatting Kafka storage in {b.home / 'data'} failed: {res.stdout}{res.stderr}")


def _log4j_config() -> Path:
    return Path(__file__).parent / "log4j2.properties"


def up(b: Broker | None = None, timeout: float = 90.0) -> Broker:
    """Start the broker unless it runs; return when it answers Kafka requests."""
    from stoker.kafka.topics import check_reachable

    b = b or default_broker()
    if b.process.running():
        check_reachable(b.client_config(), timeout=timeout)
        return b
    if port_open(b.port):
        raise StackError(
            f"port {b.port} is in use by a process this stack did not start: stop it or set STOKER_KAFKA_PORT"
        )
    b.home.mkdir(parents=True, exist_ok=True)
    b.log_dir.mkdir(exist_ok=True)
    b.config_file.write_text(_server_properties(b))
    (b.home / "secure").unlink(missing_ok=True)
    if b.secure:
        (b.home / "secure").write_text("SASL_SSL\n")  # how `stoker kafka status`/`down` find it again
    _format_storage(b)
    heap = os.environ.get("STOKER_KAFKA_HEAP", "-Xmx512m")
    cmd = [_java(), *heap.split(), "-XX:+UseG1GC", "-Djava.awt.headless=true",
           f"-Dlog4j2.configurationFile={_log4j_config()}", f"-Dkafka.logs.dir={b.log_dir}",
           "-cp", _classpath(), "kafka.Kafka", str(b.config_file)]
    proc = b.process.spawn(cmd, log=b.log_dir / "stdout.log", cwd=b.home)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StackError(f"Kafka exited with {proc.returncode} at start: see {b.log_dir}/server.log and stdout.log")
        if port_open(b.port) and (not b.secure or port_open(b.internal_port)):
            if b.secure:
                from stoker_local.broker import secure

                secure.grant(secure.internal_config(f"127.0.0.1:{b.internal_port}", secure.tls_dir(b.home)), b.home)
            check_reachable(b.client_config(), timeout=max(1.0, deadline - time.monotonic()))
            return b
        time.sleep(0.3)
    down(b)
    raise StackError(f"Kafka did not answer on {b.bootstrap} within {timeout:.0f}s: see {b.log_dir}/server.log")


def down(b: Broker | None = None, timeout: float = 30.0) -> bool:
    """Stop the broker this stack started (TERM, then KILL), and this process's reused clients of it; False if
    none was running."""
    from stoker.kafka.clients import forget_admins

    b = b or default_broker()
    forget_admins(b.bootstrap)
    return b.process.stop(grace=timeout)


def status(b: Broker | None = None) -> dict[str, object]:
    b = b or default_broker()
    pid = b.process.pid()
    return {"running": pid is not None, "pid": pid, "bootstrap": b.bootstrap, "home": str(b.home),
            "kafka_version": KAFKA_VERSION, "security_protocol": "SASL_SSL" if b.secure else "PLAINTEXT",
            **({"client_config": {k: v for k, v in b.client_config().items() if k != "sasl.password"},
                "password_file": str(b.home / "credentials.json")} if b.secure else {})}


def status_json(b: Broker | None = None) -> str:
    return json.dumps(status(b), indent=2)
