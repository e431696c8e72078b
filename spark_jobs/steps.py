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
from orjson import loads as _orjson_loads

# Drop reasons (the manifest's docs_dropped keys).
INVALID_UTF8 = "invalid_utf8"
INVALID_JSON = "invalid_json"
MISSING_TEXT = "missing_text"
INVALID_UNICODE = "invalid_unicode"
EMPTY_TEXT = "empty_text"
TOO_SHORT = "too_short"
TOO_LONG = "too_long"
DUPLICATE = "duplicate"
CORRUPT_FILE = "corrupt_file"  # a file that does not decompress (or is no Parquet): one record, the whole file

COMPRESSED_SUFFIXES = (".gz", ".zst", ".zstd")


QUARANTINE_HEAD = 4096  # bytes of a corrupt file kept in the quarantine


@dataclass(slots=True)
class Parsed:
    """One input record after validation: ``text`` when kept, ``reason`` (+ ``detail``) when not."""

    source: str
    pos: int
    """Where the record is in ``source``: the byte offset of its first byte (in the decompressed
    stream of a .gz/.zst file), or the row index of a Parquet file."""
    text: str | None = None
    reason: str | None = None
    detail: str | None = None
    raw: bytes | None = None
    digest: bytes | None = None
    scrubbed: int = 0
    """Addresses the PII scrubbing replaced in ``text``."""


def parquet_record(source: str, pos: int, value: Any, text_field: str, absent: str = "") -> Parsed:
    """One Parquet row's text column (``absent`` names the columns when the file has no such one);
    the quarantine keeps ``{text_field: value}`` as JSON, the row's exact value."""
    raw = json.dumps({text_field: value}, ensure_ascii=False, default=str).encode()
    if not isinstance(value, str):
        what = absent or ("null" if value is None else type(value).__name__)
        return Parsed(source=source, pos=pos, reason=MISSING_TEXT, raw=raw, detail=f"column {text_field!r} is {what}")
    return Parsed(source=source, pos=pos, text=value, raw=raw)


def parse_line(source: str, pos: int, raw: bytes, fmt: str, text_field: str) -> Parsed:
    """Decode and extract the text of one line; never raises on bad input.

    A JSONL line takes the fast path first: orjson parses the bytes, which proves them valid UTF-8 without lone
    surrogates, in one pass (measured: ~3x ``json.loads`` of the decoded line plus the two checks). Whatever it
    refuses, or parses to anything but an object with a string text, goes the exact path below, so a record is
    kept, or dropped with its reason, exactly as before; orjson accepts only what ``json`` accepts alike."""
    if fmt != "text":
        try:
            obj = _orjson_loads(raw)
        except ValueError:
            obj = None
        if type(obj) is dict:
            value = obj.get(text_field)
            if type(value) is str:
                return Parsed(source=source, pos=pos, text=value, raw=raw)
    return _parse_line_exactly(source, pos, raw, fmt, text_field)


def _parse_line_exactly(source: str, pos: int, raw: bytes, fmt: str, text_field: str) -> Parsed:
    def drop(reason: str, detail: str) -> Parsed:
        return Parsed(source=source, pos=pos, reason=reason, detail=detail, raw=raw)

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
    return Parsed(source=source, pos=pos, text=text, raw=raw)


def clean(p: Parsed, normalization: str, min_chars: int, max_chars: int, digest: bool = True,
          quality: Any = None, decided: bool = False) -> Parsed:
    """Normalise, strip, length-check, then the ``quality:`` filters and scrubbing when ``quality`` (a
    :class:`spark_jobs.quality.Filters`) is given; sets ``digest`` (sha256 of the clean text) for dedup, unless
    ``digest`` is False (the pack pass, which skips duplicates by place). ``decided``: the filters kept this
    record before (the pack pass after the index pass), so only what changes its text runs."""
    if p.reason is not None or p.text is None:
        return p
    text = p.text if normalization == "none" else unicodedata.normalize(normalization, p.text)  # type: ignore[arg-type]
    text = text.strip()
    if not text:
        return Parsed(source=p.source, pos=p.pos, reason=EMPTY_TEXT, detail="blank after strip", raw=_raw(p))
    if len(text) < min_chars:
        return Parsed(source=p.source, pos=p.pos, reason=TOO_SHORT,
                      detail=f"{len(text)} chars < clean.min_chars {min_chars}", raw=_raw(p))
    if len(text) > max_chars:
        return Parsed(source=p.source, pos=p.pos, reason=TOO_LONG,
                      detail=f"{len(text)} chars > clean.max_chars {max_chars}", raw=_raw(p))
    scrubbed = 0
    if quality is not None:
        verdict = quality.transform(text) if decided else quality.apply(text)
        if verdict.text is None:
            return Parsed(source=p.source, pos=p.pos, reason=verdict.reason, detail=verdict.detail, raw=_raw(p))
        text, scrubbed = verdict.text, verdict.scrubbed
        if not text.strip():  # C4 removed every line (its sentence minimum off)
            return Parsed(source=p.source, pos=p.pos, reason=EMPTY_TEXT, detail="blank after the quality filters",
                          raw=_raw(p))
    return Parsed(source=p.source, pos=p.pos, text=text, raw=p.raw, scrubbed=scrubbed,
                  digest=hashlib.sha256(text.encode()).digest() if digest else None)


def kept_texts(records: Iterable[Parsed], normalization: str, min_chars: int, max_chars: int, skip: Any,
               batch: int, holdout_per_mille: int = 0, quality: Any = None, decided: bool = False
               ) -> Iterator[tuple[list[str], list[str], list[bool], list[int], list[int]]]:
    """What a pack task tokenises, in batches of (texts, their source files, whether each is held out, the
    addresses the scrubbing replaced in each, their positions in the source files): the
    records cleaned again and kept, less those in ``skip`` (the duplicates, by place, and with ``decided`` every
    record the quality filters dropped, so the others need only their text changes). A text is held out by its
    digest (:func:`stoker.run.holdout.held_out`), computed only when something is held out."""
    from stoker.run.holdout import held_out

    texts: list[str] = []
    sources: list[str] = []
    held: list[bool] = []
    scrubbed: list[int] = []
    positions: list[int] = []
    for p in records:
        if (p.source, p.pos) in skip:  # before cleaning: a duplicate is not filtered twice
            continue
        p = clean(p, normalization, min_chars, max_chars, digest=holdout_per_mille > 0, quality=quality,
                  decided=decided)
        if p.reason is not None:
            continue
        texts.append(p.text or "")
        sources.append(p.source)
        held.append(p.digest is not None and held_out(p.digest, holdout_per_mille))
        scrubbed.append(p.scrubbed)
        positions.append(p.pos)
        if len(texts) == batch:
            yield texts, sources, held, scrubbed, positions
            texts, sources, held, scrubbed, positions = [], [], [], [], []
    if texts:
        yield texts, sources, held, scrubbed, positions


def _raw(p: Parsed) -> bytes:
    return p.raw if p.raw is not None else (p.text or "").encode("utf-8")


class Skips:
    """Records to leave out of the pack pass, by (source, pos): the duplicates the dedup found (and the records the
    quality filters dropped, see spark_jobs/read.py ``pack_skips``).
    Sorted positions per source file, 8 bytes a record, looked up by bisection."""

    def __init__(self, by_source: dict[str, np.ndarray] | None = None) -> None:
        self._by = by_source or {}

    @classmethod
    def of(cls, names: list[str], codes: np.ndarray, positions: np.ndarray) -> Skips:
        """``codes[i]`` indexes ``names``: record i is at ``(names[codes[i]], positions[i])``."""
        order = np.lexsort((positions, codes))
        codes, positions = codes[order], positions[order]
        bounds = np.searchsorted(codes, np.arange(len(names) + 1))
        return cls({n: positions[bounds[i]:bounds[i + 1]] for i, n in enumerate(names) if bounds[i + 1] > bounds[i]})

    def __len__(self) -> int:
        return sum(len(a) for a in self._by.values())

    def __contains__(self, key: tuple[str, int]) -> bool:
        arr = self._by.get(key[0])
        if arr is None:
            return False
        i = int(np.searchsorted(arr, key[1]))
        return i < len(arr) and int(arr[i]) == key[1]


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
    A batch of documents is joined with its EOS ids in one copy and cut into windows with array
    operations (:meth:`add_batch`): no Python work per token, little per document.
    """

    seq_len: int
    eos_id: int
    pad_id: int
    _buf: list[np.ndarray] = field(default_factory=list)
    _buf_len: int = 0
    _starts: list[np.ndarray] = field(default_factory=list)
    """Where each buffered document starts, relative to the buffer's first token."""
    tokens: int = 0
    padding: int = 0

    @property
    def width(self) -> int:
        return self.seq_len + 1

    def add(self, ids: Iterable[int] | np.ndarray) -> Iterator[Packed]:
        return self.add_batch([ids if isinstance(ids, np.ndarray) else np.asarray(list(ids), dtype=np.int64)])

    def add_batch(self, docs: list[Any]) -> Iterator[Packed]:
        """Documents' ids (arrays or lists, EOS not included), in order; the windows they fill."""
        if not docs:
            return
        eos = np.array([self.eos_id], dtype=np.int64)
        lens = np.fromiter((len(d) + 1 for d in docs), dtype=np.int64, count=len(docs))
        flat = np.concatenate([x for d in docs for x in (d, eos)]).astype(np.int64, copy=False)
        self._starts.append(self._buf_len + np.cumsum(lens) - lens)
        self._buf.append(flat)
        self._buf_len += len(flat)
        self.tokens += len(flat)
        if self._buf_len >= self.width:
            yield from self._take_full()

    def _take_full(self) -> Iterator[Packed]:
        w = self.width
        buf = self._buf[0] if len(self._buf) == 1 else np.concatenate(self._buf)
        starts = np.concatenate(self._starts) if self._starts else np.zeros(0, dtype=np.int64)
        n = self._buf_len // w
        cuts = np.searchsorted(starts, np.arange(n + 1) * w)  # the documents that start in each window
        for i in range(n):
            yield Packed(tokens=buf[i * w:(i + 1) * w],  # a view: the buffer is never written again
                         doc_starts=(starts[cuts[i]:cuts[i + 1]] - i * w).tolist(), valid=None)
        rest, rest_starts = buf[n * w:], starts[cuts[n]:] - n * w
        self._buf, self._starts = ([rest] if len(rest) else []), ([rest_starts] if len(rest_starts) else [])
        self._buf_len = len(rest)

    def flush(self) -> Iterator[Packed]:
        if self._buf_len == 0:
            return
        n = self._buf_len
        self.padding += self.width - n
        self._buf.append(np.full(self.width - n, self.pad_id, dtype=np.int64))
        self._buf_len = self.width
        last = next(self._take_full())
        last.valid = n
        yield last
