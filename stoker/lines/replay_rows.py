"""Replay rows on disk: streamed in as they are read, memory-mapped out by every rank.

A night that replays 5% of 10 M sequences of 4,096 tokens draws ~526,000 rows, 8.6 GB as ``uint32``. Held in
the train task's worker as Python objects, then as one array, and loaded whole by each rank, that was ~17 GB
in the worker and ~8.6 GB per rank. Here the rows go to a folder, one flat file per field, one row at a time
(:class:`RowWriter`): the worker holds a row and the file buffers, whatever the night's size. The folder's
``meta.json``, written last, says how many rows it holds and makes it complete; the folder appears under its
name in one rename. :class:`ReplayRows` memory-maps the fields read-only, so a rank touches only the pages of
the rows it trains and the ranks of one host share them in the page cache.

Fields (row ``i``; all little-endian):

* ``tokens.bin``      ``uint32`` ``[rows, seq_len + 1]``: the sequence's token ids
* ``valid.bin``       ``int64`` ``[rows]``: its valid length, -1 when all of it is
* ``doc_starts.bin``  ``uint32``: every row's document starts, back to back
* ``doc_bounds.bin``  ``int64`` ``[rows + 1]``: row ``i``'s starts are ``doc_starts[doc_bounds[i]:doc_bounds[i+1]]``
* ``keys.bin`` / ``key_bounds.bin``: the rows' keys (``replay:<topic>:<key>``), bytes back to back, and ``int64``
  bounds as for the starts

A store an earlier Stoker left as one ``.npz`` file is still read (:class:`ReplayRows` takes either).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from stoker.exceptions import StokerError
from stoker.files import atomic_write_json

ROWS_VERSION = 1
_FIELDS = {"tokens": "<u4", "valid": "<i8", "doc_starts": "<u4", "doc_bounds": "<i8", "keys": "u1",
           "key_bounds": "<i8"}


def rows_present(path: Path) -> bool:
    """A complete folder of rows (its ``meta.json`` is written last), or an earlier Stoker's ``.npz``."""
    return (path / "meta.json").is_file() or (path.suffix == ".npz" and path.is_file())


def remove_rows(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


class RowWriter:
    """Rows appended to ``out``'s fields as they come; :meth:`close` makes the folder whole under its name."""

    def __init__(self, out: Path, seq_len: int) -> None:
        import numpy as np

        self.out, self.seq_len, self.rows = out, seq_len, 0
        self.tmp = out.with_name(out.name + ".tmp")
        remove_rows(self.tmp)
        self.tmp.mkdir(parents=True)
        self.files = {name: (self.tmp / f"{name}.bin").open("wb", buffering=1 << 20) for name in _FIELDS}
        self.starts = self.key_bytes = 0
        self.files["doc_bounds"].write(np.zeros(1, "<i8").tobytes())
        self.files["key_bounds"].write(np.zeros(1, "<i8").tobytes())

    def add(self, key: bytes, seq: Any) -> None:
        import numpy as np

        tokens = np.asarray(seq.tokens)
        if tokens.shape != (self.seq_len + 1,):
            raise StokerError(f"replay row {key!r}: {tokens.shape[0]} token ids, the night's rows have "
                              f"seq_len + 1 = {self.seq_len + 1}")
        starts = np.asarray(seq.doc_starts, dtype="<u4")
        self.starts += len(starts)
        self.key_bytes += len(key)
        f = self.files
        f["tokens"].write(tokens.astype("<u4", copy=False).tobytes())
        f["valid"].write(np.asarray([-1 if seq.valid is None else seq.valid], "<i8").tobytes())
        f["doc_starts"].write(starts.tobytes())
        f["doc_bounds"].write(np.asarray([self.starts], "<i8").tobytes())
        f["keys"].write(key)
        f["key_bounds"].write(np.asarray([self.key_bytes], "<i8").tobytes())
        self.rows += 1

    def close(self) -> int:
        """Flush the fields, write ``meta.json`` and put the folder in place of any earlier one. The rows."""
        for f in self.files.values():
            f.close()
        atomic_write_json(self.tmp / "meta.json", {"version": ROWS_VERSION, "rows": self.rows, "seq_len": self.seq_len,
                                                   "fields": _FIELDS})
        remove_rows(self.out)
        self.tmp.rename(self.out)
        return self.rows

    def abandon(self) -> None:
        for f in self.files.values():
            f.close()
        remove_rows(self.tmp)


def write_rows(out: Path, rows: Any, seq_len: int) -> int:
    """``rows`` (pairs of key and sequence) written to ``out`` as :class:`RowWriter` does."""
    writer = RowWriter(out, seq_len)
    try:
        for key, seq in rows:
            writer.add(key, seq)
    except BaseException:
        writer.abandon()
        raise
    return writer.close()


class ReplayRows:
    """The rows of a folder :class:`RowWriter` wrote, memory-mapped and decoded on demand (or of an earlier
    Stoker's ``.npz``, loaded)."""

    def __init__(self, path: Path) -> None:
        import json

        import numpy as np

        self.path = path
        if path.suffix == ".npz" and path.is_file():
            with np.load(path, allow_pickle=False) as d:
                self.tokens, self.valid, self._keys = d["tokens"], d["valid"], d["keys"]
                self.doc_starts, self.doc_bounds = d["doc_starts"], d["doc_bounds"]
            return
        meta = json.loads((path / "meta.json").read_text())
        if meta.get("version") != ROWS_VERSION:
            raise StokerError(f"{path}: replay rows of version {meta.get('version')!r}, this Stoker reads "
                              f"{ROWS_VERSION}: remove the folder and relaunch (the draw is made again)")
        rows, width = int(meta["rows"]), int(meta["seq_len"]) + 1

        def field(name: str, shape: tuple[int, ...] | None = None) -> Any:
            file = path / f"{name}.bin"
            if file.stat().st_size == 0:
                return np.zeros(shape or 0, dtype=_FIELDS[name])
            return np.memmap(file, dtype=_FIELDS[name], mode="r", shape=shape)

        self.tokens = field("tokens", (rows, width))
        self.valid, self.doc_starts, self.doc_bounds = field("valid", (rows,)), field("doc_starts"), field("doc_bounds")
        self._key_bytes, self._key_bounds = field("keys"), field("key_bounds")
        self._keys = None

    def __len__(self) -> int:
        return len(self.valid)

    def key(self, i: int) -> bytes:
        if self._keys is not None:
            return str(self._keys[i]).encode()
        return self._key_bytes[self._key_bounds[i]:self._key_bounds[i + 1]].tobytes()

    def sequence(self, i: int) -> Any:
        from stoker.run.records import PackedSequence

        v = int(self.valid[i])
        return PackedSequence(self.tokens[i], "replay", self.doc_starts[self.doc_bounds[i]:self.doc_bounds[i + 1]],
                              None if v < 0 else v)
