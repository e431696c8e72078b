"""HDFS as the control plane sees it: the NameNode's WebHDFS REST API (the standard library is
enough), with short timeouts and errors a person can act on. Spark itself reads over hdfs:// RPC."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from stoker.exceptions import SourceError
from stoker.stores.base import CONNECT_TIMEOUT_S, FileInfo

WEBHDFS_DEFAULT_PORT = 9870



def webhdfs_url_for(uri: str, webhdfs_url: str | None = None) -> str:
    """The NameNode's HTTP address: given, or ``http://<namenode host>:9870`` (Hadoop 3's default)."""
    if webhdfs_url:
        return webhdfs_url.rstrip("/")
    host = urllib.parse.urlsplit(uri).hostname
    if not host:
        raise SourceError(f"source uri {uri!r}: no NameNode: write hdfs://<namenode>:<port>/<path>")
    return f"http://{host}:{WEBHDFS_DEFAULT_PORT}"


class HdfsStore:
    """WebHDFS (the NameNode's REST API): the same namespace Spark reads over RPC.

    Paths are kept as raw HDFS paths apart from the ``hdfs://host:port`` part, so names with
    ``#``, ``?`` or ``%`` are quoted once, never re-parsed."""

    def __init__(self, webhdfs_url: str | None = None, user: str | None = None) -> None:
        self.webhdfs_url = webhdfs_url
        self.user = user or os.environ.get("HADOOP_USER_NAME") or _login()

    @staticmethod
    def _split(uri: str) -> tuple[str, str]:
        """``hdfs://nn:8020/a/b`` → (``hdfs://nn:8020``, ``/a/b``)."""
        scheme, rest = uri.split("://", 1)
        authority, _, path = rest.partition("/")
        return f"{scheme}://{authority}", "/" + path

    def _url(self, base: str, path: str, op: str, **params: str) -> str:
        q = urllib.parse.urlencode({"op": op, "user.name": self.user, **params})
        return f"{webhdfs_url_for(base, self.webhdfs_url)}/webhdfs/v1{urllib.parse.quote(path, safe='/')}?{q}"

    def open_url(self, uri: str, offset: int = 0) -> str:
        """The WebHDFS address that streams ``uri`` from byte ``offset`` (it redirects to a DataNode)."""
        base, path = self._split(uri)
        return self._url(base, path, "OPEN", offset=str(offset))

    def _request(self, uri: str, url: str, method: str = "GET", data: bytes | None = None) -> Any:
        base = webhdfs_url_for(uri, self.webhdfs_url)
        req = urllib.request.Request(url, method=method, data=data)
        try:
            with urllib.request.urlopen(req, timeout=CONNECT_TIMEOUT_S) as r:
                body = r.read()
        except urllib.error.HTTPError as e:
            exc, detail = _remote_exception(e)
            if e.code == 404 and exc == "FileNotFoundException":
                return None
            if e.code == 404:
                raise SourceError(f"{uri}: {base} answered 404 without a WebHDFS error ({detail}): it is not the "
                                  "NameNode's WebHDFS; fix source.webhdfs_url (http://<namenode>:9870)") from None
            if exc in ("StandbyException", "RetriableException", "SafeModeException") or e.code >= 500:
                raise SourceError(f"{uri}: the NameNode at {base} cannot serve now ({detail}): try again later",
                                  transient=True) from None
            if e.code in (401, 403):
                raise SourceError(f"{uri}: the NameNode at {base} refused user {self.user!r} ({detail}): set "
                                  "HADOOP_USER_NAME or grant the user read access") from None
            raise SourceError(f"{uri}: the NameNode at {base} answered {e.code} ({detail})") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise SourceError(f"{uri}: cannot reach the NameNode's WebHDFS at {base} ({reason}): check the "
                              "hdfs:// host and that the NameNode is up (source.webhdfs_url sets its HTTP "
                              "address when it is not <host>:9870)", transient=True) from None
        try:
            return json.loads(body) if body else {}
        except ValueError:
            raise SourceError(f"{uri}: {base} did not answer WebHDFS JSON: fix source.webhdfs_url") from None

    def list_files(self, uri: str) -> list[FileInfo]:
        """Every file under ``uri`` (or ``uri`` itself, when it is a file), recursively."""
        base, root = self._split(uri)
        out: list[FileInfo] = []
        todo = [root.rstrip("/") or "/"]
        while todo:
            path = todo.pop()
            listing = self._request(uri, self._url(base, path, "LISTSTATUS"))
            if listing is None:
                continue
            for st in listing["FileStatuses"]["FileStatus"]:
                child = path if not st["pathSuffix"] else f"{path.rstrip('/')}/{st['pathSuffix']}"
                if st["type"] == "DIRECTORY":
                    todo.append(child)
                else:
                    out.append(FileInfo(base + child, int(st["length"]),
                                        mtime=st["modificationTime"] / 1000 if "modificationTime" in st else None))
        return sorted(out, key=lambda f: f.uri)

    def exists(self, uri: str) -> bool:
        return self.status(uri) is not None

    def status(self, uri: str) -> FileInfo | None:
        """The file's size and modification time now, None if there is no such file."""
        base, path = self._split(uri)
        got = self._request(uri, self._url(base, path, "GETFILESTATUS"))
        if got is None:
            return None
        st = got["FileStatus"]
        return FileInfo(uri, int(st["length"]), mtime=st["modificationTime"] / 1000 if "modificationTime" in st
                        else None)

    def check(self, uri: str) -> None:
        base, _ = self._split(uri)
        if self._request(uri, self._url(base, "/", "GETFILESTATUS")) is None:
            raise SourceError(f"{uri}: the root folder is missing: is {webhdfs_url_for(uri, self.webhdfs_url)} "
                              "this cluster's NameNode?")

    def put(self, uri: str, data: bytes) -> None:
        """Create (overwrite) a file: the NameNode redirects the write to a DataNode."""
        base, path = self._split(uri)
        self._request(uri, self._url(base, path.rsplit("/", 1)[0] or "/", "MKDIRS"), method="PUT")
        req = urllib.request.Request(self._url(base, path, "CREATE", overwrite="true"), method="PUT")
        opener = urllib.request.build_opener(_NoRedirect)
        try:
            opener.open(req, timeout=CONNECT_TIMEOUT_S)
            raise SourceError(f"{uri}: WebHDFS CREATE did not redirect to a DataNode")
        except urllib.error.HTTPError as e:
            if e.code != 307:
                raise SourceError(f"{uri}: WebHDFS CREATE answered {e.code} ({_remote_exception(e)[1]})") from None
            location = e.headers["Location"]
        self._request(uri, location, method="PUT", data=data)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _remote_exception(e: urllib.error.HTTPError) -> tuple[str | None, str]:
    """(the Java exception's simple name, a one-line description) of a WebHDFS error answer."""
    try:
        r = json.loads(e.read() or b"{}").get("RemoteException", {})
    except (ValueError, AttributeError):
        return None, f"HTTP {e.code}"
    exc = r.get("exception")
    return exc, f"{exc or e.code}: {r.get('message', '')}"


def _login() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "stoker"


