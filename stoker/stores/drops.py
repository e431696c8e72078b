"""Where a night's drop lives, as the control plane sees it: local folders, S3 and HDFS.

Spark reads the data itself (S3A, the HDFS client pyspark ships). This module answers the small
questions around that read, in seconds and with errors a person can act on:

* ``await_source``: is the drop complete (its success marker, or any data file, is present)?
* the job's preflight: can the store be reached, do the credentials work, does the bucket exist?
  A bad credential or an unreachable NameNode fails here, named, before Spark starts reading and
  before anything (a manifest, a topic) is written.

S3 goes through boto3 with short timeouts; HDFS through the NameNode's WebHDFS REST API (the
standard library is enough). Credentials come from an Airflow connection of the Amazon provider's
shape (``aws_default``: login = access key id, password = secret key, extra ``endpoint_url``,
``region_name``, ``aws_session_token``) or from the usual AWS environment variables, and reach
Spark as ``fs.s3a.*`` settings (:meth:`S3Settings.hadoop_conf`).
"""

from __future__ import annotations

from typing import Any

from stoker.exceptions import SourceError
from stoker.stores.base import Store
from stoker.stores.hdfs import HdfsStore
from stoker.stores.local import LocalStore, is_data_path
from stoker.stores.s3 import S3Settings, S3Store


def scheme_of(uri: str) -> str:
    return uri.split("://", 1)[0].lower() if "://" in uri else "file"


def uses_s3(cfg: Any) -> bool:
    """Whether the corpus's Spark job reads or writes S3: its source, or its near-dedup index (both through the
    source's connection, ``aws_conn_id``)."""
    uris = [cfg.source.uri, *([cfg.quality.near_dedup.index] if cfg.quality.near_dedup.enabled else [])]
    return any(scheme_of(u) in ("s3", "s3a") for u in uris)


def open_store(uri: str, *, s3: S3Settings | None = None, webhdfs_url: str | None = None) -> Store:
    scheme = scheme_of(uri)
    if scheme in ("s3", "s3a"):
        return S3Store(s3 or S3Settings.from_env())
    if scheme == "hdfs":
        return HdfsStore(webhdfs_url)
    if scheme == "file":
        return LocalStore()
    raise SourceError(f"source uri {uri!r}: scheme {scheme!r} is not one of file, s3, s3a, hdfs")


def join(uri: str, name: str) -> str:
    return uri.rstrip("/") + "/" + name


def drop_status(store: Store, uri: str, success_marker: str | None) -> tuple[bool, str]:
    """(complete?, what was seen) for one night's drop at ``uri``. Raises :class:`SourceError`
    for a store that cannot answer (unreachable, refused credentials, missing bucket)."""
    if success_marker:
        marker = join(uri, success_marker)
        if store.exists(marker):
            return True, f"{marker} present"
        return False, f"waiting for {marker}"
    data = [f for f in store.list_files(uri) if is_data_path(uri, f.uri)]
    return (True, f"{len(data)} data files") if data else (False, f"waiting for any data file under {uri}")
