"""Model lines: each refresh of a corpus continues a model, night after night.

A line is a sequence of trained nights ordered by date (``stoker.layout.LineLayout``). The rules:

* **Parent.** Night ``ds`` continues the newest night of its line whose date is before ``ds``; the
  line's first night starts from ``train.init`` (``random``: the recipe's shape; else a local
  Hugging Face folder). The parent is fixed when the night's trainer first launches, so every
  retry of that night starts from the same model, and a re-run of a night (a new publication)
  starts again from its parent, never from its own half-trained state.
* **Head.** The newest night that finished. A night becomes part of the line only when its train
  task succeeded (every sequence consumed, the trainer exited cleanly): a failed or half-finished
  night never does.
* **Older nights.** A night older than the head (a backfill after newer nights trained) is a clear
  decision, ``train.older_nights``: ``branch`` (default) trains it from the newest night before
  it and records it, but the head stays: the newer nights were trained without it (re-run them
  to fold it in); ``refuse`` fails its train task with that message.
* **Agreement.** The corpus tokenizer must be the one the parent was trained with (sha256), or,
  for a Hugging Face start, fit the model (vocabulary, EOS and PAD ids): checked before Spark runs.

No torch, Airflow or Spark here: the train operator, the Spark stage's operator and the trainer
all read the same files.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from stoker import paths
from stoker.exceptions import ConfigError, StokerError
from stoker.layout import LineLayout, NightFiles
from stoker.manifest import atomic_write_json, sha256_file


@dataclass(kw_only=True, slots=True)
class TokenizerFacts:
    path: str
    sha256: str
    vocab_size: int
    """Ids the tokenizer can produce (its highest id + 1)."""
    eos_id: int
    pad_id: int


def tokenizer_facts(path: str | Path, eos_token: str, pad_token: str) -> TokenizerFacts:
    """Read a ``tokenizers`` JSON file without the library (the Airflow side may not have it)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        vocab = data.get("model", {}).get("vocab") or {}
        ids = dict(vocab) if isinstance(vocab, dict) else {piece[0]: i for i, piece in enumerate(vocab)}
        ids.update({t["content"]: int(t["id"]) for t in data.get("added_tokens", [])})
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        raise ConfigError(f"tokenizer.path = {str(path)!r}: not a readable tokenizers JSON file ({e!r})") from None

    def token_id(token: str, key: str) -> int:
        if token not in ids:
            raise ConfigError(f"tokenizer.{key} = {token!r}: not in the tokenizer {path}; name one of its "
                              "special tokens")
        return int(ids[token])

    return TokenizerFacts(path=str(path), sha256=sha256_file(path), vocab_size=max(ids.values(), default=-1) + 1,
                          eos_id=token_id(eos_token, "eos_token"), pad_id=token_id(pad_token, "pad_token"))


@dataclass(kw_only=True, slots=True)
class Parent:
    """What a night starts from."""

    kind: str
    """``random``, ``hf`` (a local Hugging Face folder) or ``night`` (a night of the line)."""
    line: str
    path: str = ""
    """The HF folder, or the parent night's folder."""
    ds: str = ""
    """The parent night's date (kind ``night``)."""
    role: str = "head"
    """What the night being trained becomes: ``head`` or ``branch`` (older than the head)."""

    def describe(self) -> str:
        if self.kind == "night":
            return f"night {self.ds} of line {self.line} ({self.path})"
        return f"a Hugging Face model ({self.path})" if self.kind == "hf" else "random weights (the recipe's shape)"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Parent:
        return cls(**{k: d[k] for k in ("kind", "line", "path", "ds", "role") if k in d})


def read_night(night: NightFiles) -> dict[str, Any]:
    return dict(json.loads(night.record.read_text()))


def head(line: LineLayout) -> dict[str, Any] | None:
    """The line's newest trained night's record, None before its first."""
    nights = line.nights()
    return read_night(nights[-1]) if nights else None


def plan(line: LineLayout, ds: str, init: str, older_nights: str) -> Parent:
    """The parent of night ``ds`` (see the module's rules); refuses an older night if told to."""
    before = [n for n in line.nights() if n.folder.name < ds]
    top = head(line)
    role = "branch" if top is not None and top["ds"] > ds else "head"
    if role == "branch" and older_nights == "refuse":
        raise StokerError(
            f"night {ds} is older than line {line.name}'s head, night {top['ds'] if top else '?'} "
            f"(train.older_nights: refuse): the line only moves forward. To train it anyway set "
            f"train.older_nights: branch (it trains from the newest night before it and the head stays), or "
            f"train it on a line of its own (train.line)")
    if before:
        return Parent(kind="night", line=line.name, path=str(before[-1].folder), ds=before[-1].folder.name,
                      role=role)
    if init == "random":
        return Parent(kind="random", line=line.name, role=role)
    folder = paths.resolve_local(init)
    if not (folder / "config.json").is_file():
        raise ConfigError(f"train.init = {init!r}: {folder} is not a Hugging Face model folder (no config.json); "
                          "use 'random' or a local folder saved with save_pretrained")
    return Parent(kind="hf", line=line.name, path=str(folder), role=role)


def _model_config(parent: Parent) -> dict[str, Any]:
    folder = NightFiles(Path(parent.path)).model if parent.kind == "night" else Path(parent.path)
    return dict(json.loads((folder / "config.json").read_text()))


def check_agreement(parent: Parent, tok: TokenizerFacts) -> None:
    """The corpus tokenizer and the model the night continues agree; else a ConfigError naming both."""
    if parent.kind == "random":
        return
    if parent.kind == "night":
        was = read_night(NightFiles(Path(parent.path)))["tokenizer"]
        if was["sha256"] != tok.sha256:
            raise ConfigError(
                f"tokenizer {tok.path} (sha256 {tok.sha256[:12]}, {tok.vocab_size} ids) is not the one "
                f"{parent.describe()} was trained with: {was['path']} (sha256 {was['sha256'][:12]}, "
                f"{was['vocab_size']} ids). Point tokenizer.path at that file, or start a new line (train.line)")
        return
    cfg = _model_config(parent)
    problems = []
    if int(cfg.get("vocab_size", 0)) < tok.vocab_size:
        problems.append(f"the model has {cfg.get('vocab_size')} embeddings, the tokenizer {tok.vocab_size} ids")
    for name, mine in (("eos_token_id", tok.eos_id), ("pad_token_id", tok.pad_id)):
        theirs = cfg.get(name)
        if theirs is not None and mine not in (theirs if isinstance(theirs, list) else [theirs]):
            problems.append(f"the model's {name} is {theirs}, the corpus tokenizer's is {mine}")
    own = Path(parent.path) / "tokenizer.json"
    if own.is_file() and sha256_file(own) != tok.sha256:
        problems.append(f"the model's own tokenizer {own} differs (sha256 {sha256_file(own)[:12]} vs "
                        f"{tok.sha256[:12]})")
    if problems:
        raise ConfigError(f"tokenizer {tok.path} does not fit {parent.describe()}: " + "; ".join(problems) +
                          ". Use the model's tokenizer (tokenizer.path, eos_token, pad_token) or another train.init")


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
    trained_at: str = ""
    lineage: list[dict[str, Any]] = field(default_factory=list)
    """Every night of the model's history, oldest first, this one last (plus its HF start, if any)."""

    def entry(self) -> dict[str, Any]:
        keys = ("ds", "corpus", "topic", "sequences", "tokens", "steps", "first_loss", "last_loss", "offsets")
        return {k: getattr(self, k) for k in keys}


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
              trained_at=datetime.now(UTC).isoformat(timespec="seconds"))
    n.lineage = [*history, n.entry()]
    return n


def _link_tree(src: Path, dst: Path) -> None:
    """A copy made of hard links where the file system allows (a checkpoint is big), else bytes."""
    def link(s: str, d: str) -> None:
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)
    shutil.copytree(src, dst, copy_function=link)


def promote(line: LineLayout, night: Night, checkpoints: Path, export: Path) -> NightFiles:
    """Record a finished night in its line: its final checkpoint, its HF export with a model card, its
    record last. Atomic per night: a reader sees the old night folder or the whole new one."""
    tag = (checkpoints / "latest").read_text().strip()
    final = line.night(night.ds)
    tmp = NightFiles(final.folder.with_name(f".{night.ds}.tmp{os.getpid()}"))
    shutil.rmtree(tmp.folder, ignore_errors=True)
    tmp.checkpoint.mkdir(parents=True)
    _link_tree(checkpoints / tag, tmp.checkpoint / tag)
    (tmp.checkpoint / "latest").write_text(tag)
    _link_tree(export, tmp.model)
    tmp.card.unlink(missing_ok=True)
    tmp.card.write_text(model_card(night))
    atomic_write_json(tmp.record, asdict(night))
    old = final.folder.with_name(f".{night.ds}.old{os.getpid()}")
    if final.folder.exists():
        final.folder.rename(old)
    tmp.folder.rename(final.folder)
    shutil.rmtree(old, ignore_errors=True)
    return final


def _loss(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def model_card(n: Night) -> str:
    """A README a user can read: the line, its parent, every night it was trained on, the recipe, the loss."""
    start = n.lineage[0].get("init", "random") if n.lineage and "init" in n.lineage[0] else "random"
    rows = [e for e in n.lineage if "ds" in e]
    lines = [
        "---", "library_name: transformers", "tags: [stoker, continued-pretraining]", "---", "",
        f"# Model line `{n.line}`, night {n.ds}", "",
        f"Trained by Stoker from corpus `{n.corpus}` on {n.trained_at}. Parent: "
        + (f"night {n.parent['ds']} of line `{n.parent['line']}`." if n.parent["kind"] == "night"
           else f"{n.parent['kind']} start ({n.parent.get('path') or 'the recipe shape'})."),
        f"The line started from: {start}. Role of this night: {n.parent.get('role', 'head')}.", "",
        f"Recipe `{n.recipe}`, {n.world_size} rank(s); tokenizer `{n.tokenizer['path']}` "
        f"(sha256 `{n.tokenizer['sha256']}`, {n.tokenizer['vocab_size']} ids, EOS {n.tokenizer['eos_id']}, "
        f"PAD {n.tokenizer['pad_id']}).", "",
        "## Nights this model was trained on (oldest first)", "",
        "| night | corpus | topic | offsets [start, end) per partition | sequences | tokens | steps | "
        "first loss | last loss |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in rows:
        offsets = ", ".join(f"{p}: {a}-{b}" for p, (a, b) in sorted(e["offsets"].items(), key=lambda kv: int(kv[0])))
        lines.append(f"| {e['ds']} | {e['corpus']} | `{e['topic']}` | {offsets} | {e['sequences']:,} | "
                     f"{e['tokens']:,} | {e['steps']} | {_loss(e['first_loss'])} | {_loss(e['last_loss'])} |")
    total = sum(e["tokens"] for e in rows)
    lines += ["", f"{len(rows)} night(s), {total:,} tokens in all.", ""]
    return "\n".join(lines)
