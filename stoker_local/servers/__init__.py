"""Real storage servers on 127.0.0.1, for the tests and for trying S3/HDFS corpora locally.

* :class:`SeaweedS3`: SeaweedFS (Apache-2.0) master + volume + filer + S3 gateway in one ``weed
  server`` process, built from the Go module proxy by ``make test-servers`` and cached per user.
* :class:`MiniHdfs`: Apache Hadoop's own NameNode and DataNode in one JVM
  (``MiniHadoopClusterManager -nomr`` from hadoop-client-minicluster, Maven Central), at the
  Hadoop version pyspark's client speaks.

Each runs in its own session with its data and log under ``home``; ``stop()`` ends the whole
process group. Use them as context managers.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stoker import paths
from stoker.exceptions import StackError
from stoker.paths import write_private
from stoker.process import ProcessRecord
from stoker.stores.connectors import HADOOP_VERSION
from stoker.stores.hdfs import HdfsStore
from stoker.stores.s3 import S3Settings, S3Store

SEAWEEDFS_VERSION = "v0.0.0-20261109003541-7506e5f91cd6"
"""The github.com/seaweedfs/seaweedfs module version (the Makefile reads it from here)."""


def weed_binary() -> Path:
    path = paths.cache_dir() / f"seaweedfs-{SEAWEEDFS_VERSION.removeprefix('v0.0.0-')}" / "weed"
    if not path.is_file():
        raise StackError(f"SeaweedFS is not built ({path} is missing): run `make test-servers` (it builds "
                         "`weed` from the Go module proxy, once per user)")
    return path


def hdfs_libs() -> Path:
    libs = paths.cache_dir() / f"hdfs-{HADOOP_VERSION}" / "libs"
    if not (libs.parent / ".complete").exists():
        raise StackError(f"Hadoop's mini cluster jars are missing in {libs}: run `make test-servers`")
    return libs


def free_ports(n: int, start: int = 20000, end: int = 28000) -> int:
    """The first of ``n`` consecutive ports on 127.0.0.1 that nothing listens on.

    The default range lies below Linux's ephemeral ports (32768-60999), where any client socket can
    take a port for a moment and a later bind then fails, and below Stoker's fixed ports (28080-29870)."""
    rng = secrets.SystemRandom()
    for _ in range(200):
        base = rng.randrange(start, end - n)
        if all(_bindable(base + i) for i in range(n)):
            return base
    raise StackError(f"no {n} consecutive free ports in [{start}, {end})")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


class _Server:
    name = "server"
    stop_grace = 20.0
    """Seconds between TERM and KILL."""

    def __init__(self, home: Path) -> None:
        self.home = Path(home)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def log_file(self) -> Path:
        return self.home / f"{self.name}.log"

    @property
    def process(self) -> ProcessRecord:
        return ProcessRecord(self.home / f"{self.name}.pid")

    def _spawn(self, cmd: list[str], env: dict[str, str] | None = None) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.proc = self.process.spawn(cmd, log=self.log_file, env={**os.environ, **(env or {})}, cwd=self.home)

    def recorded_pid(self) -> int | None:
        """The pid this server's home recorded, if that very process still runs (a detached server)."""
        return self.process.pid()

    def _wait(self, ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.proc is not None and self.proc.poll() is not None:
                    raise StackError(f"{self.name} exited with {self.proc.returncode} while starting:\n"
                                     f"{self.log_tail()}")
                with contextlib.suppress(Exception):
                    if ready():
                        return
                time.sleep(0.3)
        except BaseException:  # Ctrl-C, or the server died: leave nothing running in its own session
            self.stop()
            raise
        self.stop()
        raise StackError(f"{self.name} did not become ready in {timeout:.0f}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> bool:
        """Stop the process group (started here, or recorded in ``home`` by an earlier ``start``)."""
        stopped = self.process.stop(grace=self.stop_grace)
        if self.proc is not None:
            self.proc.wait(timeout=10)
        return stopped

    def __enter__(self) -> Any:
        self.start()  # type: ignore[attr-defined]
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class SeaweedS3(_Server):
    """An S3-compatible endpoint with one identity (``access_key``/``secret_key``) allowed everything."""

    name = "seaweedfs"
    stop_grace = 3.0  # it flushes at once on TERM, then idles on a closed gRPC stream for good

    def __init__(self, home: Path, base_port: int | None = None) -> None:
        super().__init__(home)
        self.base_port = base_port or free_ports(8)
        try:  # a server restarted on the same home keeps its identity
            keys = json.loads((self.home / "credentials.json").read_text())
            self.access_key, self.secret_key = keys["access_key"], keys["secret_key"]
        except (OSError, ValueError, KeyError):
            self.access_key = "stoker" + secrets.token_hex(4)
            self.secret_key = secrets.token_urlsafe(24)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.base_port + 6}"

    @property
    def settings(self) -> S3Settings:
        return S3Settings(endpoint_url=self.endpoint_url, region="us-east-1", access_key=self.access_key,
                          secret_key=self.secret_key)

    def store(self) -> S3Store:
        return S3Store(self.settings)

    def start(self, timeout: float = 60.0) -> SeaweedS3:
        data = self.home / "data"
        data.mkdir(parents=True, exist_ok=True)
        creds = self.home / "credentials.json"
        write_private(creds, json.dumps({"access_key": self.access_key, "secret_key": self.secret_key}))
        config = self.home / "s3.json"
        write_private(config, json.dumps({"identities": [{
            "name": "stoker", "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        p = self.base_port
        self._spawn([str(weed_binary()), "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                     f"-master.port={p}", f"-master.port.grpc={p + 1}", f"-volume.port={p + 2}",
                     f"-volume.port.grpc={p + 3}", "-filer", f"-filer.port={p + 4}", f"-filer.port.grpc={p + 5}",
                     "-s3", f"-s3.port={p + 6}", f"-s3.port.grpc={p + 7}", "-s3.port.iceberg=0",
                     "-s3.port.lance=0", f"-s3.config={config}", "-master.volumeSizeLimitMB=64",
                     "-volume.max=32", "-master.telemetry=false"])
        store = self.store()
        self._wait(lambda: store.client.list_buckets() is not None, timeout)
        return self

    def connection(self) -> dict[str, Any]:
        """This server as an Airflow connection of the Amazon provider's shape (``AIRFLOW_CONN_*``)."""
        return {"conn_type": "aws", "login": self.access_key, "password": self.secret_key,
                "extra": {"endpoint_url": self.endpoint_url, "region_name": "us-east-1"}}

    def create_bucket(self, bucket: str) -> None:
        store = self.store()
        if any(b["Name"] == bucket for b in store.client.list_buckets().get("Buckets", [])):
            return
        store.client.create_bucket(Bucket=bucket)
        # the gateway answers before the filer has a volume to write to: wait for a first write
        def writable() -> bool:
            store.put(f"s3://{bucket}/.probe", b"")
            return True

        self._wait(writable, 60)
        store.client.delete_object(Bucket=bucket, Key=".probe")


class MiniHdfs(_Server):
    """One NameNode and one DataNode (real daemons, one JVM); permissions off, so any user may write."""

    name = "hdfs"

    def __init__(self, home: Path, rpc_port: int | None = None, http_port: int | None = None) -> None:
        super().__init__(home)
        base = free_ports(2) if rpc_port is None or http_port is None else 0
        self.rpc_port = rpc_port or base
        self.http_port = http_port or base + 1

    @property
    def url(self) -> str:
        return f"hdfs://127.0.0.1:{self.rpc_port}"

    @property
    def webhdfs_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def uri(self, path: str) -> str:
        return f"{self.url}/{path.lstrip('/')}"

    def store(self) -> HdfsStore:
        return HdfsStore(self.webhdfs_url)

    def _live_datanodes(self) -> int:
        q = f"{self.webhdfs_url}/jmx?qry=Hadoop:service=NameNode,name=FSNamesystemState"
        with urllib.request.urlopen(q, timeout=2) as r:
            beans = json.load(r)["beans"]
        return int(beans[0]["NumLiveDataNodes"]) if beans else 0

    def start(self, timeout: float = 120.0) -> MiniHdfs:
        java = shutil.which("java")
        if java is None:
            raise StackError("java not found: install a JDK 17+ (Debian: apt-get install openjdk-17-jre-headless)")
        base = self.home / "dfs"
        self._spawn([java, "-Xmx512m", f"-Dtest.build.data={self.home / 'build'}",
                     "-cp", f"{hdfs_libs()}/*", "org.apache.hadoop.mapreduce.MiniHadoopClusterManager",
                     "-nomr", "-format", "-datanodes", "1", "-nnport", str(self.rpc_port),
                     "-nnhttpport", str(self.http_port), "-D", f"hdfs.minidfs.basedir={base}",
                     "-D", "dfs.permissions.enabled=false", "-D", "dfs.replication=1",
                     "-D", "dfs.datanode.hostname=127.0.0.1", "-D", "dfs.namenode.safemode.extension=0"])
        self._wait(lambda: self._live_datanodes() >= 1, timeout)
        return self
