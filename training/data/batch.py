"""Packed records → model inputs: inputs/labels shifted by one, per-document position ids.

Position ids restart at every document start (and at the window start, where a continued document
resumes), so with ``attention_mask=None`` transformers builds a block-diagonal causal mask and no
token attends across a document boundary. Labels of padding are -100 (ignored by the loss).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stoker.run.records import PackedSequence

IGNORE = -100


@dataclass(slots=True)
class Batch:
    input_ids: np.ndarray
    """int64 [batch, seq_len]."""
    labels: np.ndarray
    """int64 [batch, seq_len]; -100 where nothing is to be predicted (padding)."""
    position_ids: np.ndarray
    """int64 [batch, seq_len]; restart at 0 at each document start."""
    keys: list[bytes]
    """Sequence ids of the rows (for exactly-once audits)."""
    real: np.ndarray | None = None
    """bool [batch, seq_len]: input positions holding a real token, not padding (None: all real)."""

    @property
    def tokens(self) -> int:
        """Tokens that carry a label (the real training signal)."""
        return int((self.labels != IGNORE).sum())


def position_ids(seq_len: int, doc_starts: np.ndarray) -> np.ndarray:
    """0..n within each document; ``doc_starts`` are offsets in the seq_len+1 window."""
    pos = np.arange(seq_len, dtype=np.int64)
    starts = np.unique(np.concatenate([[0], doc_starts[doc_starts < seq_len].astype(np.int64)]))
    seg = np.searchsorted(starts, pos, side="right") - 1
    return pos - starts[seg]


def make_batch(seqs: list[PackedSequence], keys: list[bytes], seq_len: int) -> Batch:
    tokens = np.stack([s.tokens for s in seqs]).astype(np.int64)  # the one copy: into the batch
    inputs, labels = tokens[:, :-1], tokens[:, 1:].copy()
    real = None
    for row, s in enumerate(seqs):
        if s.valid is not None:  # padding tail: nothing to predict from position valid-1 on
            labels[row, max(s.valid - 1, 0):] = IGNORE
            if real is None:
                real = np.ones(inputs.shape, dtype=bool)
            real[row, s.valid:] = False
    pos = np.stack([position_ids(seq_len, s.doc_starts) for s in seqs])
    return Batch(input_ids=np.ascontiguousarray(inputs), labels=labels, position_ids=pos, keys=keys, real=real)


def concat(a: Batch, b: Batch) -> Batch:
    """The rows of ``a`` then those of ``b`` as one batch."""
    if a.real is None and b.real is None:
        real = None
    else:
        real = np.concatenate([x.real if x.real is not None else np.ones(x.input_ids.shape, dtype=bool)
                               for x in (a, b)])
    return Batch(input_ids=np.concatenate([a.input_ids, b.input_ids]), labels=np.concatenate([a.labels, b.labels]),
                 position_ids=np.concatenate([a.position_ids, b.position_ids]), keys=[*a.keys, *b.keys], real=real)
