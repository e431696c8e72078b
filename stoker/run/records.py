"""The Kafka wire format of one packed training sequence.

Value: ``seq_len + 1`` token ids, little-endian, ``uint16`` when the vocabulary fits in 16 bits,
else ``uint32`` — raw bytes, no JSON on the hot path; decode is a zero-copy ``np.frombuffer``.

Key: a deterministic sequence id ``p<spark partition>-s<index>``, unique within a run and the same
on every retry (the input is partitioned and ordered deterministically before packing).

Headers:
  ``stoker.config.schema``  schema version (``1``)
  ``stoker.run``     run id (``<corpus>/<ds>``)
  ``stoker.dtype``   ``uint16`` | ``uint32``
  ``stoker.docs``    uint32 LE offsets inside the sequence where a document starts (optional)
  ``stoker.valid``   count of real tokens when the tail is padding (absent: all are real)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from stoker.exceptions import RecordError

SCHEMA_VERSION = 1
_SCHEMA_BYTES = str(SCHEMA_VERSION).encode()
H_SCHEMA = "stoker.config.schema"
H_RUN = "stoker.run"
H_DTYPE = "stoker.dtype"
H_DOCS = "stoker.docs"
H_VALID = "stoker.valid"

DTYPES: dict[str, np.dtype] = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}


_DTYPES_BY_HEADER = {k.encode(): (k, v) for k, v in DTYPES.items()}
_U4 = np.dtype("<u4")
_NO_DOCS = np.zeros(0, dtype=_U4)
_NO_DOCS.flags.writeable = False  # shared by every record without document starts


def dtype_for_vocab(vocab_size: int) -> str:
    """The narrowest wire dtype that holds every id of a vocabulary."""
    if vocab_size < 1:
        raise RecordError(f"vocab_size = {vocab_size}: must be >= 1")
    if vocab_size <= 1 << 16:
        return "uint16"
    if vocab_size <= 1 << 32:
        return "uint32"
    raise RecordError(f"vocab_size = {vocab_size}: more than 2**32 ids cannot be encoded")


def make_key(spark_partition: int, index: int) -> bytes:
    return b"p%05d-s%09d" % (spark_partition, index)


def done_key(spark_partition: int) -> bytes:
    """The key of a Spark task's done record in ``<topic>.tasks`` (``b"p00003"``): its partition, whole. (It was
    ``make_key(p, 0)[:6]``, which is the same below 100,000 tasks and cut task 100,000 to task 10,000's key.)"""
    return b"p%05d" % spark_partition


def parse_key(key: bytes) -> tuple[int, int]:
    try:
        p, s = key.decode("ascii").split("-")
        return int(p[1:]), int(s[1:])
    except (ValueError, UnicodeDecodeError):
        raise RecordError(f"key = {key!r}: not a Stoker sequence id 'p<partition>-s<index>'") from None


@dataclass(slots=True)
class PackedSequence:
    """One decoded record. ``tokens`` is a read-only view on the message bytes (no copy)."""

    tokens: np.ndarray
    run_id: str
    doc_starts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype="<u4"))
    valid: int | None = None

    @property
    def n_real(self) -> int:
        return len(self.tokens) if self.valid is None else self.valid


def encode_value(tokens: Sequence[int] | np.ndarray, dtype: str) -> bytes:
    np_dtype = DTYPES.get(dtype)
    if np_dtype is None:
        raise RecordError(f"dtype = {dtype!r}: must be one of {sorted(DTYPES)}")
    arr = np.asarray(tokens)
    if arr.size and (arr.min() < 0 or arr.max() > np.iinfo(np_dtype).max):
        raise RecordError(
            f"token id range [{arr.min()}, {arr.max()}] does not fit {dtype}: use a wider dtype"
        )
    return arr.astype(np_dtype, copy=False).tobytes()


def encode_headers(
    run_id: str, dtype: str, doc_starts: Iterable[int] | None = None, valid: int | None = None
) -> list[tuple[str, bytes]]:
    headers = [
        (H_SCHEMA, str(SCHEMA_VERSION).encode()),
        (H_RUN, run_id.encode()),
        (H_DTYPE, dtype.encode()),
    ]
    if doc_starts is not None:
        headers.append((H_DOCS, np.asarray(list(doc_starts), dtype="<u4").tobytes()))
    if valid is not None:
        headers.append((H_VALID, str(valid).encode()))
    return headers


def decode(value: bytes, headers: Iterable[tuple[str, bytes]] | None, seq_len: int | None = None) -> PackedSequence:
    """Decode one message; ``seq_len`` (when given) is checked against the value's length. The
    trainer's hot path (one call a record): checks stay, every lookup is done once."""
    h = dict(headers) if headers else {}
    schema = h.get(H_SCHEMA)
    if schema != _SCHEMA_BYTES:
        raise RecordError(f"header {H_SCHEMA} = {schema!r}: this reader understands schema {SCHEMA_VERSION}")
    found = _DTYPES_BY_HEADER.get(h.get(H_DTYPE, b""))  # the header's bytes: no decoding
    if found is None:
        raise RecordError(f"header {H_DTYPE} = {h.get(H_DTYPE, b'').decode(errors='replace')!r}: must be one of "
                          f"{sorted(DTYPES)}")
    dtype, np_dtype = found
    n, odd = divmod(len(value), np_dtype.itemsize)
    if odd:
        raise RecordError(f"value of {len(value)} bytes is not a whole number of {dtype} ids")
    if seq_len is not None and n != seq_len + 1:
        raise RecordError(f"sequence holds {n} ids, expected seq_len + 1 = {seq_len + 1}")
    docs, valid, run = h.get(H_DOCS), h.get(H_VALID), h.get(H_RUN)
    return PackedSequence(np.frombuffer(value, np_dtype), run.decode() if run else "",
                          np.frombuffer(docs, _U4) if docs else _NO_DOCS, int(valid) if valid is not None else None)
