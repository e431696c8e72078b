"""What every store (local folder, S3, HDFS) answers with, apart from how each one is reached
(:mod:`stoker.stores.local`, :mod:`stoker.stores.s3`, :mod:`stoker.stores.hdfs`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 15.0


@dataclass(frozen=True, slots=True)
class FileInfo:
    uri: str
    size: int
    etag: str | None = None
    mtime: float | None = None
    """Last modification, epoch seconds (what the store reports)."""


class Store(Protocol):
    def list_files(self, uri: str) -> list[FileInfo]: ...
    def exists(self, uri: str) -> bool: ...
    def check(self, uri: str) -> None: ...
    def put(self, uri: str, data: bytes) -> None: ...
