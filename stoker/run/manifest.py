"""The run manifest: the commit point of a refresh.

Written last and atomically (temp file in the same folder, fsync, rename), so a reader sees either
no manifest or a whole one. Every later stage trusts it, never a guess: the topic, per partition
the offset range and the count of sequences, the totals, the tokenizer and its sha256.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stoker.exceptions import ManifestError
from stoker.files import atomic_write_json
from stoker.layout import MANIFEST_NAME

MANIFEST_VERSION = 1


@dataclass(kw_only=True, slots=True)
class PartitionRange:
    partition: int
    start_offset: int
    """First offset of the run in this partition (inclusive)."""
    end_offset: int
    """Offset after the run's last record (exclusive): the partition's end offset once published.
    With transactions, commit markers occupy offsets too, so end - start >= sequences."""
    sequences: int


@dataclass(kw_only=True, slots=True)
class Manifest:
    run_id: str
    corpus: str
    ds: str
    topic: str
    partitions: list[PartitionRange]
    seq_len: int
    dtype: str
    tokenizer_path: str
    tokenizer_sha256: str
    vocab_size: int
    docs_in: int
    docs_kept: int
    docs_dropped: dict[str, int]
    tokens: int
    """Real tokens published (documents + one EOS each), padding excluded."""
    padding_tokens: int
    sequences: int
    source_uri: str
    source_files: list[dict[str, Any]] = field(default_factory=list)
    spark_app_id: str = ""
    quarantine_path: str = ""
    created_at: str = ""
    retention_ms: int = 0
    """The topic's retention.ms when published (0: not recorded): its records may expire from
    ``created_at + retention_ms`` on, consumed or not."""
    seconds: float = 0.0
    eos_id: int = -1
    """The id the packer put after every document (the corpus's ``tokenizer.eos_token``); -1: not
    recorded (a manifest of an earlier Stoker)."""
    pad_id: int = -1
    """The id of padding (``tokenizer.pad_token``); -1: not recorded."""
    holdout: dict[str, Any] = field(default_factory=dict)
    """The documents held out of training (``eval.holdout_per_mille``), kept with the night
    (:func:`stoker.run.holdout.account`): per_mille, path, sequences, docs, tokens, bytes and per source file;
    ``docs_kept`` counts them, ``tokens`` and ``sequences`` do not. Empty: nothing held out."""
    scrubbed: dict[str, int] = field(default_factory=dict)
    """The PII scrubbing (``quality.pii``): ``docs``, the kept documents (trained or held out) it changed, and
    ``addresses``, the e-mail and IP addresses it replaced in them. Empty: scrubbing off."""
    tokenizer_backend: dict[str, Any] = field(default_factory=dict)
    """Which library encoded the night and why (spark_jobs/tokenizer_backends.py ``Choice``): name, version,
    reason, wanted, checked_docs (before Spark), check_every, checked_in_tasks, unproven. Empty: not recorded."""
    version: int = MANIFEST_VERSION

    def check(self) -> None:
        """Invariants every reader relies on; a violation means a bug, not bad input."""
        dropped = sum(self.docs_dropped.values())
        if self.docs_in != self.docs_kept + dropped:
            raise ManifestError(
                f"{self.run_id}: docs_in {self.docs_in} != kept {self.docs_kept} + dropped {dropped}"
            )
        per_part = sum(p.sequences for p in self.partitions)
        if per_part != self.sequences:
            raise ManifestError(f"{self.run_id}: partition sequences {per_part} != total {self.sequences}")
        for p in self.partitions:
            if p.end_offset - p.start_offset < p.sequences:
                raise ManifestError(f"{self.run_id}: partition {p.partition} range too small for {p.sequences}")

    @property
    def publication(self) -> str:
        """Which publication of the topic this is: a re-run recreates a topic of the same name with
        other data, and a trainer's offsets into the old one mean nothing in the new one."""
        return f"{self.run_id}@{self.created_at}"

    def end_offsets(self) -> dict[int, int]:
        return {p.partition: p.end_offset for p in self.partitions}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        if data.get("version") != MANIFEST_VERSION:
            raise ManifestError(f"manifest version {data.get('version')!r}: this reader understands {MANIFEST_VERSION}")
        data = dict(data)
        data["partitions"] = [PartitionRange(**p) for p in data["partitions"]]
        return cls(**data)


def write_manifest(run_dir: str | Path, manifest: Manifest) -> Path:
    manifest.check()
    path = Path(run_dir) / MANIFEST_NAME
    atomic_write_json(path, manifest.to_dict())
    return path


def read_manifest(path: str | Path) -> Manifest:
    """Read a manifest file (or the manifest inside a run folder)."""
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManifestError(f"{path}: no manifest: the run has not published (tokenize_publish not done)") from None
    except (OSError, json.JSONDecodeError) as e:
        raise ManifestError(f"{path}: unreadable manifest: {e}") from None
    try:
        m = Manifest.from_dict(data)
    except TypeError as e:
        raise ManifestError(f"{path}: malformed manifest: {e}") from None
    m.check()
    return m
