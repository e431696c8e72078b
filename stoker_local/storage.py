"""``stoker storage up|down|status``: the local S3 (SeaweedFS) and HDFS holding the sample corpus,
on fixed ports, for trying the S3/HDFS corpora in ``corpora/examples`` through the whole flow.

The servers themselves (:mod:`stoker_local.servers`) come with a checkout only, not with the wheel.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stoker import paths
from stoker.exceptions import StackError
from stoker.process import ProcessRecord

S3_BASE_PORT = 29400
"""`stoker storage up`'s SeaweedFS uses 29400-29407; its S3 endpoint is http://127.0.0.1:29406."""
HDFS_RPC_PORT, HDFS_HTTP_PORT = 29820, 29870
"""`stoker storage up`'s NameNode: hdfs://127.0.0.1:29820, WebHDFS on http://127.0.0.1:29870
(corpora/examples/sample_hdfs.yaml points there)."""


def storage_home() -> Path:
    return paths.state_dir() / "storage"


def s3_connection_file() -> Path:
    return storage_home() / "s3" / "connection.json"


def local_s3_connection_env() -> dict[str, str]:
    """``AIRFLOW_CONN_AWS_DEFAULT`` for the local S3 server while `stoker storage up` runs it."""
    f = s3_connection_file()
    if not f.is_file() or not ProcessRecord(storage_home() / "s3" / "seaweedfs.pid").running():
        return {}
    return {"AIRFLOW_CONN_AWS_DEFAULT": f.read_text().strip()}


def _servers() -> Any:
    try:
        from stoker_local import servers
    except ImportError:
        raise StackError("`stoker storage` needs a checkout of Stoker (its test servers are not in the wheel): "
                         "run it from the repository after `make test-servers`") from None
    return servers


def local_s3() -> Any:
    return _servers().SeaweedS3(storage_home() / "s3", base_port=S3_BASE_PORT)


def local_hdfs() -> Any:
    return _servers().MiniHdfs(storage_home() / "hdfs", rpc_port=HDFS_RPC_PORT, http_port=HDFS_HTTP_PORT)


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
        _servers().write_private(s3_connection_file(), json.dumps(s3.connection()))
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
