"""A model line's nights and its rules: each refresh of a corpus continues a model, night after night.

A line is a sequence of trained nights ordered by date (``stoker.layout.LineLayout``). The rules:

* **Nights.** A night is one corpus's publication for one date: several corpora may feed one line,
  and each keeps its own night per date (``nights/<ds>.<corpus>``); no corpus's night replaces
  another's. A re-run of a night (a new publication of the same date and corpus) replaces it.
* **Head.** The night that joined last as the line's continuation and was promoted. A night joins only
  when its train task succeeded (every sequence consumed, the trainer exited cleanly): a failed or
  half-finished night never does; it joins *pending* and is neither head nor parent until the gate, the
  corpus's rule or a person decides it (:mod:`stoker.lines.ledger`, the one writer of the records, holds
  the states). Joins are numbered (``seq``), so the head is well defined when two corpora's nights share
  a date.
* **Parent.** A night continues the head when the head is not newer than it (same date: another
  corpus's night of that date, whichever trained first) and does not already hold an earlier
  publication of this very night (a re-run never trains its data twice into one model). The line's
  first night starts from ``train.init`` (``random``: the recipe's shape; else a local Hugging Face
  folder). So both corpora's nights of one date end up in the head, in the order they trained, and
  the next date continues the later of them.
* **Older nights.** A night the head cannot take (the head is newer: a backfill, or a night that
  failed and whose retry came after the line moved on) is a clear decision, ``train.older_nights``:
  ``branch`` (default) trains it from the newest night not dated after it (another corpus's night of
  the same date included) that does not hold it, and records it, but the head stays: the newer
  nights were trained without it (re-run them to fold it in); ``refuse`` fails its train task with
  that message.
* **Every launch chooses again.** The train task chooses the parent and the role, and checks the tokenizer,
  at each (re)launch, not once: between a failed try and its retry another night may have joined.
  A night whose chosen parent changed restarts from the new parent (its checkpoints were trained
  from the old one).
* **The gate.** A night held (or rolled back) after its evaluation (``stoker.lines.gate``) stays in the line's
  history but is never a parent: the head and every later night continue the last promoted night.
* **Agreement.** The corpus tokenizer must be the one the parent was trained with (sha256), or,
  for a Hugging Face start, fit the model (vocabulary, EOS and PAD ids): checked before Spark runs.

No torch, Airflow or Spark here: the train operator, the Spark stage's operator and the trainer
all read the same files.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from stoker.layout import LineLayout, NightFiles


class Kind(StrEnum):
    """What a night starts from."""

    RANDOM = "random"
    """Random weights in the recipe's shape (a line's first night, ``train.init: random``)."""
    HF = "hf"
    """A local Hugging Face folder (a line's first night, ``train.init: <folder>``)."""
    NIGHT = "night"
    """A night of the line."""


class Role(StrEnum):
    """What the night being trained becomes in its line."""

    HEAD = "head"
    """The line's continuation: the next night continues it once it is blessed."""
    BRANCH = "branch"
    """A night the head cannot take (it is older than the head): recorded, never the head."""


class Decision(StrEnum):
    """A night's decision in its record: the gate's (``stoker.lines.gate``) or a person's."""

    PROMOTED = "promoted"
    HELD = "held"
    ROLLED_BACK = "rolled_back"
    BRANCH = "branch"
    """Not gated: a branch never becomes the head."""
    PASSED_OVER = "passed_over"
    """Undecided when a later night continued the line past it: final, never the head (stoker.lines.ledger)."""


@dataclass(kw_only=True, slots=True)
class Parent:
    """What a night starts from."""

    kind: Kind
    line: str
    path: str = ""
    """The HF folder, or the parent night's folder."""
    ds: str = ""
    """The parent night's date (kind ``night``)."""
    corpus: str = ""
    """The parent night's corpus (kind ``night``)."""
    role: Role = Role.HEAD
    """What the night being trained becomes."""

    def __post_init__(self) -> None:
        self.kind, self.role = Kind(self.kind), Role(self.role)

    def describe(self) -> str:
        if self.kind == Kind.NIGHT:
            return f"night {self.ds} of corpus {self.corpus or '?'} in line {self.line} ({self.path})"
        return f"a Hugging Face model ({self.path})" if self.kind == Kind.HF else "random weights (the recipe's shape)"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Parent:
        return cls(**{k: d[k] for k in ("kind", "line", "path", "ds", "corpus", "role") if k in d})


def read_night(night: NightFiles) -> dict[str, Any]:
    return dict(json.loads(night.record.read_text()))


def _order(record: dict[str, Any]) -> tuple[int, str, str]:
    """Join order: ``seq`` (nights of an earlier Stoker have none: by date, before every numbered one)."""
    return int(record.get("seq", 0)), str(record["ds"]), str(record.get("corpus", ""))


def joined_nights(line: LineLayout) -> list[tuple[dict[str, Any], NightFiles]]:
    """Every night of the line with its record, in join order."""
    return sorted(((read_night(n), n) for n in line.nights()), key=lambda rn: _order(rn[0]))


def same_night(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two night records are the same join of the same night (date, corpus, join number)."""
    return a is not None and b is not None and all(a.get(k) == b.get(k) for k in ("ds", "corpus", "seq"))


@dataclass(kw_only=True, slots=True)
class Night:
    """A trained night, as the line records it (``night.json``)."""

    line: str
    ds: str
    corpus: str
    topic: str
    publication: str
    parent: dict[str, Any]
    tokenizer: dict[str, Any]
    recipe: str
    world_size: int
    steps: int
    sequences: int
    tokens: int
    first_loss: float | None
    last_loss: float | None
    offsets: dict[str, list[int]]
    """Per partition: [start, end) of the run topic."""
    partition_sequences: dict[str, int] = field(default_factory=dict)
    """Per partition: the sequences in its range (a replay draws by record: stoker/lines/replay.py)."""
    trained_at: str = ""
    seq: int = 0
    """Join order in the line (1 for its first night); set when the night joins."""
    replayed: int = 0
    """Sequences of earlier nights trained again in this night (``train.replay``)."""
    mixture: dict[str, Any] = field(default_factory=dict)
    """A mixture night's corpora (``topic`` and ``offsets`` above are its lead's): ``components``, corpus → its topic,
    the rows it trained, published, repeated and left in its topic, its target and realised label-token share; and
    ``missing``, the line's corpora it trained without and why. Empty for a night of one corpus."""
    lineage: list[dict[str, Any]] = field(default_factory=list)
    """Every night of the model's history, oldest first, this one last (plus its HF start, if any)."""

    def entry(self) -> dict[str, Any]:
        keys = ("ds", "corpus", "topic", "sequences", "tokens", "steps", "first_loss", "last_loss", "offsets",
                "partition_sequences")
        return {k: getattr(self, k) for k in keys} | ({"mixture": self.mixture} if self.mixture else {})


def night_record(manifest: Any, summary: dict[str, Any], parent: Parent) -> Night:
    """The record of a night that finished, from its manifest, its train summary and its parent."""
    if parent.kind == "night":
        history = read_night(NightFiles(Path(parent.path)))["lineage"]
    else:
        history = [{"init": parent.kind if parent.kind == "random" else parent.path}]
    n = Night(line=parent.line, ds=manifest.ds, corpus=manifest.corpus, topic=manifest.topic,
              publication=manifest.publication, parent=parent.to_dict(),
              tokenizer={"path": manifest.tokenizer_path, "sha256": manifest.tokenizer_sha256,
                         "vocab_size": manifest.vocab_size, "eos_id": manifest.eos_id, "pad_id": manifest.pad_id},
              recipe=summary["recipe"], world_size=summary["world_size"], steps=summary["steps"],
              sequences=summary["sequences_consumed"], tokens=summary["tokens_consumed"],
              first_loss=summary.get("first_loss"), last_loss=summary.get("last_loss"),
              offsets={str(p.partition): [p.start_offset, p.end_offset] for p in manifest.partitions},
              partition_sequences={str(p.partition): p.sequences for p in manifest.partitions},
              replayed=int(summary.get("sequences_replayed", 0)), mixture=_mixture(summary.get("mixture")),
              trained_at=datetime.now(UTC).isoformat(timespec="seconds"))
    n.lineage = [*history, n.entry()]
    return n


def _mixture(mix: dict[str, Any] | None) -> dict[str, Any]:
    """What the line keeps of a mixture night's train summary (training/data/mixture_source.py's ``summary``)."""
    if not mix:
        return {}
    real = mix["realised"]
    return {"components": {k: {"topic": mix["topics"][k], "rows": real["rows"].get(k, 0),
                               "published": mix["available"].get(k, 0), "repeated": mix["repeated"].get(k, 0),
                               "left": mix["left"].get(k, 0), "target": target,
                               "token_share": real["token_shares"].get(k, 0.0)}
                           for k, target in mix["targets"].items()},
            "missing": dict(mix.get("missing", {}))}
