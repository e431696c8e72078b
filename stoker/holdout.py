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

from stoker.schema import fail as _fail

if TYPE_CHECKING:
    import numpy as np

HOLDOUT_PER_MILLE_MAX = 100
"""At most a tenth of a night is held out."""
REVIEWS = ("ask", "promote", "hold", "roll-back")
"""``eval.review``: ask a person, or decide without asking (``stoker.gate.CHOICES``)."""
APPROVAL_TIMEOUT_MAX_S = 30 * 86400


@dataclass(kw_only=True, slots=True)
class EvalConfig:
    holdout_per_mille: int = 0
    """Documents per thousand held out of training (chosen by the digest of their text) and kept with the
    night as its evaluation set; 0 holds none out (no evaluation, no gate). At most 100."""
    max_regression: float = 0.01
    """The gate: a night that continues the line's head becomes the head only if no figure (bits per byte on
    its held-out documents, and on each earlier night's) is worse than the head's by more than
    max(``gate_k`` x the paired standard error, this many bits per byte); else it is held."""
    max_forgetting: float = 0.1
    """The floor of ``max_regression`` for the earlier nights' sets (forgetting): a night forgets a little of
    what it did not train on. Clean nights cost an earlier night's documents up to +0.075 bits per byte, sabotaged
    ones held there +0.17 or more (BENCHMARKS.md, "The gate against sabotage"). The night's own set keeps
    ``max_regression``."""
    gate_k: float = 2.0
    """Standard errors a figure may worsen by before the gate holds the night (see ``max_regression``)."""
    forgetting_nights: int = 3
    """Earlier nights of the lineage (the latest that kept held-out documents) the night is also scored on."""
    review: str = "ask"
    """A night the gate held: ``ask`` a person in the Airflow UI (the ``training.review`` step offers promote,
    hold and roll back with the figures; the night stays held when nobody answers within
    ``approval_timeout_s``), or decide without asking: ``hold``, ``promote``, ``roll-back``. A run may change it
    (the trigger form's "Held night"; ``stoker refresh --decision``, which never asks)."""
    approval_timeout_s: int = 86400
    """Seconds the review step waits for a person's answer on a held night; then the night stays held."""
    lm_eval_tasks: list[str] = field(default_factory=list)
    """lm-evaluation-harness tasks the evaluate step also runs, on the night's export and on the model it
    continued: their metrics (with standard errors) go to ``eval.json``, the model card and ``stoker runs show``.
    They inform and do not gate (a small model's task accuracy is mostly noise; the gate reads bits per byte).
    Runs offline: name tasks whose data is local, e.g. ``[stoker_cloze]`` from ``lm_eval_include``."""
    lm_eval_include: str | None = None
    """A folder of lm-eval task YAMLs added to the harness's own (``{state}``/``{project}`` expanded); a task's
    ``data_files`` are read relative to it. ``corpora/examples/lm_eval`` holds a small one, ``stoker_cloze``."""
    lm_eval_limit: int | None = None
    """At most this many documents of each lm-eval task (all when null)."""

    def __post_init__(self) -> None:
        if not 0 <= self.holdout_per_mille <= HOLDOUT_PER_MILLE_MAX:
            raise _fail("eval.holdout_per_mille", self.holdout_per_mille,
                        f"must be in [0, {HOLDOUT_PER_MILLE_MAX}] (documents per thousand held out of training)")
        if not 0 <= self.max_regression < 10:
            raise _fail("eval.max_regression", self.max_regression, "must be in [0, 10) bits per byte")
        if not 0 <= self.max_forgetting < 10:
            raise _fail("eval.max_forgetting", self.max_forgetting, "must be in [0, 10) bits per byte")
        if not 0 <= self.gate_k <= 10:
            raise _fail("eval.gate_k", self.gate_k, "must be in [0, 10] standard errors")
        if not 0 <= self.forgetting_nights <= 50:
            raise _fail("eval.forgetting_nights", self.forgetting_nights, "must be in [0, 50] nights")
        if self.review not in REVIEWS:
            raise _fail("eval.review", self.review, f"must be one of {', '.join(REVIEWS)}")
        if not 1 <= self.approval_timeout_s <= APPROVAL_TIMEOUT_MAX_S:
            raise _fail("eval.approval_timeout_s", self.approval_timeout_s,
                        f"must be in [1, {APPROVAL_TIMEOUT_MAX_S}] seconds (30 days)")
        if any(not isinstance(t, str) or not t.strip() for t in self.lm_eval_tasks):
            raise _fail("eval.lm_eval_tasks", self.lm_eval_tasks, "must be a list of lm-eval task names")
        if self.lm_eval_tasks and self.holdout_per_mille == 0:
            raise _fail("eval.lm_eval_tasks", self.lm_eval_tasks, "run in the evaluate step, which runs only on "
                        "nights that held documents out: set eval.holdout_per_mille above 0 (e.g. 5)")
        if self.lm_eval_limit is not None and self.lm_eval_limit < 1:
            raise _fail("eval.lm_eval_limit", self.lm_eval_limit, "must be at least 1 document (null: all)")


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


def baseline_model(parent: dict[str, Any]) -> Path | None:
    """The Hugging Face folder of what a night continued (its trainer's ``parent.json``): a night of the line,
    or a given HF model; None for random weights."""
    from stoker.layout import NightFiles

    if parent.get("kind") == "night":
        return NightFiles(Path(parent["path"])).model
    return Path(parent["path"]) if parent.get("kind") == "hf" else None


def eval_sets(night: Path, parent: dict[str, Any], ds: str, corpus: str, forgetting_nights: int) -> dict[str, Path]:
    """The held-out sets a night is scored on: ``night`` (its own, the folder ``night``) and, for a night that
    continued a night of its line, ``forgetting:<ds>.<corpus>`` for the latest ``forgetting_nights`` nights of
    the parent's lineage (the parent included) that kept theirs: what this night cost the earlier data."""
    import json

    from stoker.layout import LineLayout, NightFiles

    sets = {"night": night}
    if parent.get("kind") != "night":
        return sets
    record = NightFiles(Path(parent["path"])).record
    lineage = json.loads(record.read_text()).get("lineage", []) if record.is_file() else []
    line = LineLayout.of(parent["line"])
    for entry in reversed(lineage):
        if len(sets) > forgetting_nights:
            break
        if not entry.get("ds") or (entry["ds"], entry.get("corpus", "")) == (ds, corpus):
            continue  # the init (random or HF), and an earlier publication of this very night
        held = line.night(entry["ds"], entry.get("corpus", "")).holdout
        if held.is_dir():
            sets[f"forgetting:{entry['ds']}.{entry.get('corpus', '')}"] = held
    return sets
