"""A drop in a local (or mounted) folder, and Spark's rule for which files are data.
"""

from __future__ import annotations

from pathlib import Path

from stoker.stores.base import FileInfo


def is_data_file(name: str) -> bool:
    """Spark's rule: files whose name starts with ``_`` or ``.`` (markers, checksums) are not data."""
    return bool(name) and not name.startswith(("_", "."))


def is_data_path(root: str, uri: str) -> bool:
    """``uri`` (below ``root``) is data: no part of its path under the root is hidden, so files in
    ``_temporary/`` (a writer still at work) and folder-marker keys (``night/``) are not."""
    root = root.rstrip("/")
    rel = uri[len(root):] if uri.startswith(root + "/") else uri.rsplit("/", 1)[-1]
    if rel.endswith("/"):
        return False
    parts = [p for p in rel.split("/") if p]
    return bool(parts) and all(is_data_file(p) for p in parts)


# -------------------------------------------------------------------------------------------- local


class LocalStore:
    def _path(self, uri: str) -> Path:
        from stoker.paths import resolve_local

        return resolve_local(uri)

    def list_files(self, uri: str) -> list[FileInfo]:
        root = self._path(uri)
        if root.is_file():
            st = root.stat()
            return [FileInfo(str(root), st.st_size, mtime=st.st_mtime)]
        if not root.is_dir():
            return []
        return sorted((FileInfo(str(p), st.st_size, mtime=st.st_mtime)
                       for p in root.rglob("*") if p.is_file() and (st := p.stat())),
                      key=lambda f: f.uri)

    def exists(self, uri: str) -> bool:
        return self._path(uri).exists()

    def check(self, uri: str) -> None:
        return None

    def put(self, uri: str, data: bytes) -> None:
        p = self._path(uri)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
