"""Held-out data: a deterministic share of each night's documents that never reaches training.

A kept document is held out when its digest (sha256 of the clean text, the digest the dedup uses) falls in
the first ``eval.holdout_per_mille`` of a thousand buckets. The choice depends on the text alone: a re-run,
another partitioning or another cluster holds out the same documents, and every copy of a text goes the same
way, so a held-out text cannot reach training as a duplicate (with ``clean.dedup`` off too).

The pack tasks pack held-out documents with the same :class:`spark_jobs.steps.Packer` as the training ones and
write them, one file per task, into the run's ``holdout/`` folder before the task's last Kafka transaction
commits: a committed task always has its file, and any attempt writes the same bytes. Each file keeps, per
document, its source file, its tokens (EOS included) and its UTF-8 bytes: what bits per byte per source needs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np


def held_out(digest: bytes, per_mille: int) -> bool:
    """Whether the document whose clean text has this sha256 ``digest`` is held out."""
    return per_mille > 0 and int.from_bytes(digest[:8], "big") % 1000 < per_mille


@dataclass(slots=True)
class HoldoutPart:
    """One pack task's held-out documents, packed: ``tokens`` (sequences x (seq_len + 1)), and per document
    its source, tokens (EOS included) and UTF-8 bytes, in the order they were packed: the first
    ``sum(doc_tokens)`` tokens of the flattened sequences are the documents, the rest is the last one's padding."""

    packer: Any
    """A :class:`spark_jobs.steps.Packer` like the training one's."""
    tokens: list[np.ndarray] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    doc_source: list[int] = field(default_factory=list)
    doc_tokens: list[int] = field(default_factory=list)
    doc_bytes: list[int] = field(default_factory=list)

    def add(self, source: str, ids: list[int], text: str) -> None:
        """A held-out document: its token ids (EOS not yet added) and its clean text."""
        if source not in self.sources:
            self.sources.append(source)
        self.doc_source.append(self.sources.index(source))
        self.doc_tokens.append(len(ids) + 1)
        self.doc_bytes.append(len(text.encode("utf-8")))
        self.tokens.extend(p.tokens for p in self.packer.add(ids))

    def write(self, folder: Path, part: int, dtype: str) -> Path:
        """The last sequence padded, then the file, atomically: readers see the whole file or none; a second
        attempt replaces it with the same bytes."""
        import numpy as np

        self.tokens.extend(p.tokens for p in self.packer.flush())
        width = self.packer.width

        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"part-{part:05d}.npz"
        tmp = folder / f".{path.name}.{os.getpid()}.tmp"
        stacked = np.stack(self.tokens) if self.tokens else np.zeros((0, width))
        arrays: dict[str, Any] = {
            "tokens": stacked.astype(dtype), "sources": np.asarray(self.sources, dtype=np.str_),
            "doc_source": np.asarray(self.doc_source, dtype=np.int32),
            "doc_tokens": np.asarray(self.doc_tokens, dtype=np.int64),
            "doc_bytes": np.asarray(self.doc_bytes, dtype=np.int64)}
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return path


def read_part(path: Path) -> dict[str, Any]:
    import numpy as np

    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def documents(folder: Path) -> int:
    """Held-out documents in ``folder``'s part files (0 for a missing folder, or one whose tasks held out none):
    a set with no document is never linked into a line, scored or a figure of the gate."""
    import numpy as np

    count = 0
    for path in sorted(folder.glob("part-*.npz")) if folder.is_dir() else []:
        with np.load(path, allow_pickle=False) as z:
            count += len(z["doc_tokens"])
    return count


def account(folder: Path, per_mille: int) -> dict[str, Any]:
    """The manifest's ``holdout`` entry: what the run's held-out files hold, in all and per source file."""
    per_source: dict[str, dict[str, int]] = {}
    sequences = 0
    for path in sorted(folder.glob("part-*.npz")) if folder.is_dir() else []:
        part = read_part(path)
        sequences += len(part["tokens"])
        names = [str(s) for s in part["sources"]]
        for code, toks, nbytes in zip(part["doc_source"], part["doc_tokens"], part["doc_bytes"], strict=True):
            row = per_source.setdefault(names[int(code)], {"docs": 0, "tokens": 0, "bytes": 0})
            row["docs"] += 1
            row["tokens"] += int(toks)
            row["bytes"] += int(nbytes)
    total = {k: sum(r[k] for r in per_source.values()) for k in ("docs", "tokens", "bytes")}
    return {"per_mille": per_mille, "path": str(folder), "sequences": sequences, **total,
            "sources": [{"path": p, **r} for p, r in sorted(per_source.items())]}
