"""Streaming, splittable reads: memory per task is bounded by a batch, never by a file.

* Plain JSONL and text files are cut into byte ranges of ``source.split_bytes``: one Spark task
  per range, so one big file is tokenised by every core. A record belongs to the range its first
  byte is in (Hadoop's rule): a range that starts inside a line skips to the next one.
* ``.gz`` and ``.zst`` files are decompressed as a stream, one task per file.
* Parquet goes through Spark's own reader, projected to the text column, row groups spread over
  tasks (see :mod:`spark_jobs.read`).

Every record keeps its exact raw bytes and a stable location: the file and ``pos``, the byte
offset of the record's first byte in the (decompressed) file, or the row index of a Parquet file.
A UTF-8 byte-order mark at the start of a file belongs to the file's encoding, not to its first
record. A line longer than the limit is read through without holding it, and dropped as too long.

Before any record is read, :func:`scan_files` streams every file once (bounded chunks) for its
lineage: size and sha256, and for a compressed file whether it decompresses at all. A file that
does not is one ``corrupt_file`` record: a truncated archive never publishes half of itself.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO

from spark_jobs.steps import COMPRESSED_SUFFIXES, CORRUPT_FILE, QUARANTINE_HEAD, TOO_LONG, Parsed, parse_line

BOM = b"\xef\xbb\xbf"
CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class Split:
    """One task's share of one file: the records whose first byte is in ``[start, end)``."""

    path: str
    start: int
    end: int
    corrupt: str | None = None
    """Why the file does not decompress (from the scan): the split is then one ``corrupt_file`` record."""


def is_compressed(path: str) -> bool:
    return path.endswith(COMPRESSED_SUFFIXES)


def split_tasks(files: list[dict[str, Any]], split_bytes: int, min_tasks: int = 1) -> list[list[Split]]:
    """The job's tasks: the files' bytes, in order, cut into ``n`` equal shares, ``n`` the smallest
    multiple of ``min_tasks`` (``publish.spark_partitions``) that keeps a share under ``split_bytes``.

    A big file is cut over several tasks and small files share one, so a drop of many small files does
    not become as many tiny Kafka transactions; equal shares in a multiple of the cores leave no core
    idle at the end. A compressed or corrupt file is never cut: it goes whole to the task its first
    byte falls in. The plan depends only on the files and the settings: the same night gives the
    same tasks, so the same sequences under the same keys, on any cluster.
    """
    total, k = sum(int(f["bytes"]) for f in files), max(min_tasks, 1)
    n = -(-max(k, -(-total // split_bytes)) // k) * k
    share = max(-(-total // n), 1)
    tasks: list[list[Split]] = [[] for _ in range(n)]
    offset = 0
    for f in files:
        size, path = int(f["bytes"]), f["path"]
        if is_compressed(path) or f.get("corrupt") or size <= 0:
            tasks[min(offset // share, n - 1)].append(Split(path, 0, max(size, 1), f.get("corrupt")))
        start = 0
        while start < size and not (is_compressed(path) or f.get("corrupt")):
            t = (offset + start) // share
            end = min(size, (t + 1) * share - offset)
            tasks[min(t, n - 1)].append(Split(path, start, end))
            start = end
        offset += size
    return [t for t in tasks if t]


# -- opening files wherever they live ---------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Pin:
    """What a file was when the run listed it: each pass opens that very file, or fails."""

    bytes: int
    mtime: float | None = None
    etag: str | None = None


@dataclass(frozen=True, slots=True)
class Opener:
    """How a task reaches the store: its settings travel with the task (pickled, like the Hadoop
    configuration Spark ships with each task), not through the executors' environment."""

    s3: Any = None
    """:class:`stoker.stores.s3.S3Settings` for s3:// sources."""
    webhdfs_url: str | None = None
    """hdfs:// sources are streamed through WebHDFS (``source.webhdfs_url``, else <namenode>:9870)."""
    pins: dict[str, Pin] = field(default_factory=dict)
    """Per path, what the listing saw. The passes read each file several times (lineage, index, pack); a
    file re-delivered in between would get one pass's skips applied to another's records, and the
    manifest's sha256 would describe bytes that were not published: a changed file fails the task."""

    def open(self, path: str, start: int = 0) -> BinaryIO:
        """A buffered byte stream of ``path`` from byte ``start`` (local file, s3a://, hdfs://)."""
        scheme = path.split("://", 1)[0] if "://" in path else "file"
        pin = self.pins.get(path)
        if scheme == "file":
            f = open(path.removeprefix("file://").removeprefix("file:"), "rb")  # noqa: SIM115 - the caller closes
            if pin is not None:
                st = os.fstat(f.fileno())
                self._check(path, pin, st.st_size, st.st_mtime)
            f.seek(start)
            return f
        if scheme in ("s3", "s3a"):
            return self._open_s3(path, start, pin)
        if scheme == "hdfs":
            import urllib.request

            from stoker.stores.hdfs import HdfsStore

            store = HdfsStore(self.webhdfs_url)
            if pin is not None:
                now = store.status(path)
                self._check(path, pin, now.size if now else -1, now.mtime if now else None)
            url = store.open_url(path, start)
            return io.BufferedReader(_RawStream(urllib.request.urlopen(url, timeout=60)), CHUNK)
        raise ValueError(f"cannot open {path!r}: scheme {scheme!r}")

    def _open_s3(self, path: str, start: int, pin: Pin | None) -> BinaryIO:
        from botocore.exceptions import ClientError

        from stoker.stores.s3 import S3Settings, S3Store, split_s3

        bucket, key = split_s3(path)
        client = S3Store(self.s3 or S3Settings.from_env()).client
        match = {"IfMatch": f'"{pin.etag}"'} if pin is not None and pin.etag else {}
        try:
            body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-", **match)["Body"]
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("PreconditionFailed", "412"):
                raise _changed(path, f"its ETag is no longer {pin.etag if pin else '?'}") from None
            raise
        return io.BufferedReader(_RawStream(body), CHUNK)

    @staticmethod
    def _check(path: str, pin: Pin, size: int, mtime: float | None) -> None:
        if size != pin.bytes or (pin.mtime is not None and mtime is not None and mtime != pin.mtime):
            raise _changed(path, f"{pin.bytes} bytes, modified {pin.mtime} when listed; now {size} bytes, "
                                 f"modified {mtime}")


def _changed(path: str, how: str) -> Exception:
    from stoker.exceptions import SourceError

    return SourceError(f"{path} changed while this run read it ({how}): the drop was re-delivered or is still "
                       "being written. Nothing of this attempt is kept: let the drop settle (its _SUCCESS marker "
                       "last) and retry the task")


class _RawStream(io.RawIOBase):
    """A raw stream over anything with ``read(n)`` (an HTTP body), for ``io.BufferedReader``."""

    def __init__(self, body: Any) -> None:
        self._body = body

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data = self._body.read(len(b))
        b[:len(data)] = data
        return len(data)

    def close(self) -> None:
        self._body.close()
        super().close()


def decompressed(path: str, raw: BinaryIO) -> BinaryIO:
    if path.endswith(".gz"):
        import gzip

        return gzip.GzipFile(fileobj=raw)  # type: ignore[return-value]
    if path.endswith((".zst", ".zstd")):
        import zstandard

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, read_size=CHUNK), CHUNK)
    return raw


# -- the scan: provenance and readability, one streaming pass per file ---------------------------------
def scan_file(path: str, opener: Opener = Opener(), fmt: str = "jsonl") -> dict[str, Any]:
    """Size and sha256 of the stored bytes; for a compressed file, whether and to how much it
    decompresses; for Parquet, whether it is one (its PAR1 magic at both ends)."""
    h = hashlib.sha256()
    with opener.open(path) as raw:
        hashing = _Hashing(raw, h)
        corrupt, out = None, 0
        if is_compressed(path):
            try:
                with decompressed(path, hashing) as d:  # type: ignore[arg-type]
                    while chunk := d.read(CHUNK):
                        out += len(chunk)
            except Exception as e:  # noqa: BLE001 - any codec error makes the file unreadable, never the job
                kind = "gzip" if path.endswith(".gz") else "zstd"
                corrupt = f"{kind}: {type(e).__name__}: {e} (after {out} decompressed bytes)"
        while hashing.read(CHUNK):  # the rest of the stored bytes, for the checksum
            pass
    is_parquet = hashing.head.startswith(b"PAR1") and hashing.tail == b"PAR1"
    if fmt == "parquet" and corrupt is None and not is_parquet:
        corrupt = f"parquet: not a Parquet file (no PAR1 magic at its start and end; {hashing.size} bytes)"
    info: dict[str, Any] = {"path": path, "bytes": hashing.size, "sha256": h.hexdigest(), "corrupt": corrupt}
    if is_compressed(path):
        info["decompressed_bytes"] = out
    return info


class _Hashing(io.RawIOBase):
    """Passes a stream through, hashing and counting what is read."""

    def __init__(self, raw: BinaryIO, h: Any) -> None:
        self._raw, self._h, self.size = raw, h, 0
        self.head, self.tail = b"", b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data = self._raw.read(len(b))
        self._h.update(data)
        self.size += len(data)
        if len(self.head) < 4:
            self.head += data[:4]
        if data:
            self.tail = (self.tail + data)[-4:]
        b[:len(data)] = data
        return len(data)


def scan_batches(opener: Opener, fmt: str) -> Any:
    """mapInArrow function: rows of file paths (a JSON list each) → one lineage row (JSON) per file."""
    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import json

        import pyarrow as pa

        for batch in batches:
            for paths in batch.column("paths").to_pylist():
                yield pa.RecordBatch.from_pydict({"scan": [json.dumps(scan_file(p, opener, fmt))
                                                          for p in json.loads(paths)]})
    return run


# -- records of a split ---------------------------------------------------------------------------
def lines_of(stream: BinaryIO, start: int, end: int, max_bytes: int) -> Iterator[tuple[int, bytes, bool]]:
    """``(pos, raw line without its terminator, too_long)`` of the lines that start in ``[start, end)``.

    ``stream`` is positioned at ``start - 1`` when ``start > 0`` (to see whether a line starts at
    ``start``), else at 0. A line over ``max_bytes`` is read through in chunks; only its head is kept.
    """
    pos = start
    if start > 0:
        prev = stream.read(1)
        if prev != b"\n":  # inside a line: it belongs to the split before
            skipped = _skip_line(stream)
            pos = start + skipped
    while pos < end:
        raw = stream.readline(max_bytes + 1)
        if not raw:
            return
        n = len(raw)
        too_long = len(raw) > max_bytes and not raw.endswith(b"\n")
        if too_long:
            n += _skip_line(stream)
        yield pos, _strip_eol(raw), too_long
        pos += n


def _skip_line(stream: BinaryIO) -> int:
    """Read up to and including the next newline; the bytes consumed."""
    n = 0
    while True:
        chunk = stream.readline(CHUNK)
        n += len(chunk)
        if not chunk or chunk.endswith(b"\n"):
            return n


def _strip_eol(raw: bytes) -> bytes:
    raw = raw[:-1] if raw.endswith(b"\n") else raw
    return raw[:-1] if raw.endswith(b"\r") else raw


def split_records(split: Split, fmt: str, text_field: str, max_bytes: int,
                  opener: Opener = Opener()) -> Iterator[Parsed]:
    """Every record of one split, parsed or dropped with its reason; never raises on bad data."""
    if split.corrupt is not None:
        with opener.open(split.path) as f:
            head = f.read(QUARANTINE_HEAD)
        yield Parsed(source=split.path, pos=0, reason=CORRUPT_FILE, detail=split.corrupt, raw=head)
        return
    compressed = is_compressed(split.path)
    with opener.open(split.path, 0 if compressed else max(split.start - 1, 0)) as raw:
        stream = decompressed(split.path, raw) if compressed else raw
        end = 1 << 62 if compressed else split.end
        for pos, line, too_long in lines_of(stream, split.start, end, max_bytes):
            if pos == 0 and line.startswith(BOM):
                line = line[len(BOM):]  # the file's encoding mark, not part of its first record
            if too_long:
                yield Parsed(source=split.path, pos=pos, reason=TOO_LONG, raw=line[:QUARANTINE_HEAD],
                             detail=f"a line over {max_bytes} bytes (clean.max_chars x 4)")
                continue
            yield parse_line(split.path, pos, line, fmt, text_field)


def task_json(splits: list[Split]) -> str:
    """One task's splits as the JSON its row carries to the executor."""
    import json

    return json.dumps([asdict(s) for s in splits])
