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
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stoker import paths
from stoker.connectors import HADOOP_VERSION
from stoker.exceptions import StackError
from stoker.services import _start_ticks
from stoker.sources import HdfsStore, S3Settings, S3Store

SEAWEEDFS_VERSION = "v0.0.0-20261109003541-7506e5f91cd6"
"""The github.com/seaweedfs/seaweedfs module version; the Makefile's SEAWEEDFS_VER must match."""


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


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read, from its creation on (it holds a secret)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def free_ports(n: int, start: int = 20000, end: int = 60000) -> int:
    """The first of ``n`` consecutive ports on 127.0.0.1 that nothing listens on."""
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


def _alive(pid: int, proc: subprocess.Popen[bytes] | None) -> bool:
    if proc is not None:
        return proc.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


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
    def pid_file(self) -> Path:
        return self.home / f"{self.name}.pid"

    def _spawn(self, cmd: list[str], env: dict[str, str] | None = None) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, **(env or {})}, cwd=self.home, start_new_session=True)
        self.pid_file.write_text(json.dumps({"pid": self.proc.pid, "start": _start_ticks(self.proc.pid)}))

    def recorded_pid(self) -> int | None:
        """The pid this server's home recorded, if that very process still runs (a detached server)."""
        try:
            rec = json.loads(self.pid_file.read_text())
        except (OSError, ValueError):
            return None
        pid = int(rec["pid"])
        return pid if rec.get("start") is not None and _start_ticks(pid) == rec["start"] else None

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
        pid = self.proc.pid if self.proc is not None and self.proc.poll() is None else self.recorded_pid()
        if pid is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace
        while time.monotonic() < deadline and _alive(pid, self.proc):
            time.sleep(0.1)
        if _alive(pid, self.proc):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=10)
        self.pid_file.unlink(missing_ok=True)
        return True

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


# ----------------------------------------------------------------- `stoker storage`: local servers

S3_BASE_PORT = 39400
"""`stoker storage up`'s SeaweedFS uses 39400-39407; its S3 endpoint is http://127.0.0.1:39406."""
HDFS_RPC_PORT, HDFS_HTTP_PORT = 39820, 39870
"""`stoker storage up`'s NameNode: hdfs://127.0.0.1:39820, WebHDFS on http://127.0.0.1:39870
(corpora/examples/sample_hdfs.yaml points there)."""


def storage_home() -> Path:
    return paths.state_dir() / "storage"


def local_s3() -> SeaweedS3:
    return SeaweedS3(storage_home() / "s3", base_port=S3_BASE_PORT)


def local_hdfs() -> MiniHdfs:
    return MiniHdfs(storage_home() / "hdfs", rpc_port=HDFS_RPC_PORT, http_port=HDFS_HTTP_PORT)


def s3_connection_file() -> Path:
    return storage_home() / "s3" / "connection.json"


def local_s3_connection_env() -> dict[str, str]:
    """``AIRFLOW_CONN_AWS_DEFAULT`` for the local S3 server while `stoker storage up` runs it."""
    f = s3_connection_file()
    if not f.is_file() or local_s3().recorded_pid() is None:
        return {}
    return {"AIRFLOW_CONN_AWS_DEFAULT": f.read_text().strip()}


def _copy_night(store: Any, src: Path, dest: str) -> int:
    files = sorted(p for p in src.iterdir() if p.is_file() and not p.name.startswith(("_", ".")))
    for p in files:
        store.put(f"{dest}/{p.name}", p.read_bytes())
    store.put(f"{dest}/_SUCCESS", b"")  # last: the night is complete
    return len(files)


def storage_up(ds: str, which: tuple[str, ...] = ("s3", "hdfs"), log: Callable[[str], Any] = print) -> None:
    """Start the local S3 and/or HDFS (detached; idempotent) and copy the sample corpus into
    each as night ``ds``: ``s3://corpora/sample/<ds>/`` and ``/corpora/sample/<ds>/``."""
    sample = paths.state_dir() / "data" / "sample"
    if not (sample / "_SUCCESS").exists():
        raise StackError(f"no sample corpus in {sample}: run `make setup` (or `stoker sample-corpus`) first")
    if "s3" in which:
        s3 = local_s3()
        if s3.recorded_pid() is None:
            s3.start()
        s3.create_bucket("corpora")
        n = _copy_night(s3.store(), sample, f"s3://corpora/sample/{ds}")
        write_private(s3_connection_file(), json.dumps(s3.connection()))
        log(f"S3    {s3.endpoint_url}  (SeaweedFS; {n} files in s3://corpora/sample/{ds}/)")
        log(f"      access key {s3.access_key}, secret in {s3.home / 'credentials.json'}; `stoker refresh` and "
            "`stoker up` use it as the aws_default connection")
    if "hdfs" in which:
        h = local_hdfs()
        if h.recorded_pid() is None:
            h.start()
        n = _copy_night(h.store(), sample, h.uri(f"/corpora/sample/{ds}"))
        log(f"HDFS  {h.url}  (WebHDFS {h.webhdfs_url}; {n} files in /corpora/sample/{ds}/; "
            "data lasts until `stoker storage down`)")


def storage_down(log: Callable[[str], Any] = print) -> None:
    for server in (local_s3(), local_hdfs()):
        log(f"{server.name}: {'stopped' if server.stop() else 'was not running'}")


def storage_status() -> dict[str, Any]:
    s3, h = local_s3(), local_hdfs()
    return {"s3": {"running": s3.recorded_pid() is not None, "endpoint_url": s3.endpoint_url},
            "hdfs": {"running": h.recorded_pid() is not None, "url": h.url, "webhdfs_url": h.webhdfs_url}}
