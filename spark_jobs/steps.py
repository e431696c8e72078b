"""Per-record steps that run inside Spark tasks (Arrow batches in, Arrow batches out).

Each step only says keep or drop and why; the DataFrame layer counts ``kept`` and every
``dropped_<reason>``, so ``docs_in = docs_kept + Σ dropped`` always holds. Nothing here imports
pyspark, so the logic is tested without a JVM.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Drop reasons (the manifest's docs_dropped keys).
INVALID_UTF8 = "invalid_utf8"
INVALID_JSON = "invalid_json"
MISSING_TEXT = "missing_text"
INVALID_UNICODE = "invalid_unicode"
EMPTY_TEXT = "empty_text"
TOO_SHORT = "too_short"
TOO_LONG = "too_long"
DUPLICATE = "duplicate"
CORRUPT_FILE = "corrupt_file"  # a compressed file that does not decompress: one record, the whole file

COMPRESSED_SUFFIXES = (".gz", ".zst", ".zstd")
QUARANTINE_HEAD = 4096  # bytes of a corrupt file kept in the quarantine


@dataclass(slots=True)
class Parsed:
    """One input line after validation: ``text`` when kept, ``reason`` (+ ``detail``) when not."""

    source: str
    line: int
    text: str | None = None
    reason: str | None = None
    detail: str | None = None
    raw: bytes | None = None
    digest: bytes | None = None


def decompress(path: str, content: bytes) -> tuple[bytes | None, str | None]:
    """A file's bytes, gunzipped or un-zstd'ed by its suffix (``.gz``, ``.zst``/``.zstd``);
    ``(None, why)`` when it does not decompress."""
    try:
        if path.endswith(".gz"):
            import gzip

            return gzip.decompress(content), None
        if path.endswith((".zst", ".zstd")):
            import io

            import zstandard

            with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(content)) as r:
                return r.read(), None
    except Exception as e:  # noqa: BLE001 - any codec error makes the file unreadable, never the job
        kind = "gzip" if path.endswith(".gz") else "zstd"
        return None, f"{kind}: {type(e).__name__}: {e}"
    return content, None


def corrupt_file(path: str, content: bytes, detail: str) -> Parsed:
    """The one record a file that cannot be read counts as (its first bytes go to the quarantine)."""
    return Parsed(source=path, line=0, reason=CORRUPT_FILE, detail=f"{detail} ({len(content)} bytes)",
                  raw=content[:QUARANTINE_HEAD])


def records_of(path: str, data: bytes, fmt: str, text_field: str) -> Iterator[Parsed]:
    """Every record of one (decompressed) file, each parsed or dropped with its reason: the lines
    of ``jsonl``/``text``, the rows of ``parquet`` (numbered from 1, like lines)."""
    if fmt != "parquet":
        for line_no, raw in split_lines(data):
            yield parse_line(path, line_no, raw, fmt, text_field)
        return
    import io

    import pyarrow.parquet as pq

    try:
        table = pq.read_table(io.BytesIO(data))
    except Exception as e:  # noqa: BLE001 - not a readable Parquet file: one record, like a bad archive
        yield corrupt_file(path, data, f"parquet: {type(e).__name__}: {e}")
        return
    if text_field not in table.column_names:
        column: list[Any] = [None] * table.num_rows
        found = f"absent (columns: {', '.join(table.column_names)})"
    else:
        column, found = table.column(text_field).to_pylist(), ""
    for i, value in enumerate(column, start=1):
        raw = json.dumps({text_field: value}, ensure_ascii=False, default=str).encode()
        if not isinstance(value, str):
            what = found or ("null" if value is None else type(value).__name__)
            yield Parsed(source=path, line=i, reason=MISSING_TEXT, raw=raw, detail=f"column {text_field!r} is {what}")
        else:
            yield Parsed(source=path, line=i, text=value, raw=raw)


def split_lines(content: bytes) -> Iterator[tuple[int, bytes]]:
    """1-based line numbers; a final newline does not make an extra empty line (a blank line
    inside the file is a record, and is dropped with its reason like any other bad one)."""
    lines = content.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for i, raw in enumerate(lines, start=1):
        yield i, raw[:-1] if raw.endswith(b"\r") else raw


def parse_line(source: str, line: int, raw: bytes, fmt: str, text_field: str) -> Parsed:
    """Decode and extract the text of one line; never raises on bad input."""
    def drop(reason: str, detail: str) -> Parsed:
        return Parsed(source=source, line=line, reason=reason, detail=detail, raw=raw)

    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return drop(INVALID_UTF8, f"byte {e.start}: {e.reason}")
    if fmt == "text":
        text = decoded
    else:
        try:
            obj = json.loads(decoded)
        except json.JSONDecodeError as e:
            return drop(INVALID_JSON, str(e))
        if not isinstance(obj, dict):
            return drop(INVALID_JSON, f"a JSON {type(obj).__name__}, not an object")
        value = obj.get(text_field)
        if not isinstance(value, str):
            found = "absent" if value is None else type(value).__name__
            return drop(MISSING_TEXT, f"field {text_field!r} is {found}")
        text = value
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # lone surrogates from JSON escapes such as "\ud800"
        return drop(INVALID_UNICODE, f"char {e.start}: {e.reason}")
    return Parsed(source=source, line=line, text=text, raw=raw)


def clean(p: Parsed, normalization: str, min_chars: int, max_chars: int) -> Parsed:
    """Normalise, strip, length-check; sets ``digest`` (sha256 of the clean text) for dedup."""
    if p.reason is not None or p.text is None:
        return p
    text = p.text if normalization == "none" else unicodedata.normalize(normalization, p.text)  # type: ignore[arg-type]
    text = text.strip()
    if not text:
        return Parsed(source=p.source, line=p.line, reason=EMPTY_TEXT, detail="blank after strip", raw=_raw(p))
    if len(text) < min_chars:
        return Parsed(source=p.source, line=p.line, reason=TOO_SHORT,
                      detail=f"{len(text)} chars < clean.min_chars {min_chars}", raw=_raw(p))
    if len(text) > max_chars:
        return Parsed(source=p.source, line=p.line, reason=TOO_LONG,
                      detail=f"{len(text)} chars > clean.max_chars {max_chars}", raw=_raw(p))
    return Parsed(source=p.source, line=p.line, text=text, raw=p.raw,
                  digest=hashlib.sha256(text.encode()).digest())


def _raw(p: Parsed) -> bytes:
    return p.raw if p.raw is not None else (p.text or "").encode("utf-8")


@dataclass(slots=True)
class Packed:
    tokens: np.ndarray
    doc_starts: list[int]
    valid: int | None
    """Real tokens when the tail is padding, else None."""


@dataclass(slots=True)
class Packer:
    """Packs token streams into ``seq_len + 1`` windows with EOS after each document.

    A document longer than the room left continues into the next window; the last window of a
    partition is padded with ``pad_id`` and reports how many tokens are real, so no token is lost.
    """

    seq_len: int
    eos_id: int
    pad_id: int
    _buf: list[np.ndarray] = field(default_factory=list)
    _buf_len: int = 0
    _starts: list[int] = field(default_factory=list)
    tokens: int = 0
    padding: int = 0

    @property
    def width(self) -> int:
        return self.seq_len + 1

    def add(self, ids: Iterable[int] | np.ndarray) -> Iterator[Packed]:
        doc = np.asarray(ids, dtype=np.int64)
        doc = np.append(doc, self.eos_id)
        self.tokens += len(doc)
        self._starts.append(self._buf_len)
        self._buf.append(doc)
        self._buf_len += len(doc)
        while self._buf_len >= self.width:
            yield self._take()

    def _take(self) -> Packed:
        flat = self._buf[0] if len(self._buf) == 1 else np.concatenate(self._buf)  # views, no copy
        out, rest = flat[: self.width], flat[self.width:]
        starts = [s for s in self._starts if s < self.width]
        self._starts = [s - self.width for s in self._starts if s >= self.width]
        self._buf, self._buf_len = ([rest] if len(rest) else []), len(rest)
        return Packed(tokens=out, doc_starts=starts, valid=None)

    def flush(self) -> Iterator[Packed]:
        if self._buf_len == 0:
            return
        n = self._buf_len
        self.padding += self.width - n
        self._buf.append(np.full(self.width - n, self.pad_id, dtype=np.int64))
        self._buf_len = self.width
        last = self._take()
        last.valid = n
        yield last
