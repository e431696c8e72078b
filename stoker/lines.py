"""Model lines: each refresh of a corpus continues a model, night after night.

A line is a sequence of trained nights ordered by date (``stoker.layout.LineLayout``). The rules:

* **Nights.** A night is one corpus's publication for one date: several corpora may feed one line,
  and each keeps its own night per date (``nights/<ds>.<corpus>``); no corpus's night replaces
  another's. A re-run of a night (a new publication of the same date and corpus) replaces it.
* **Head.** The night that joined last as the line's continuation. A night joins only when its
  train task succeeded (every sequence consumed, the trainer exited cleanly): a failed or
  half-finished night never does. Joins are numbered (``seq``), so the head is well defined when
  two corpora's nights share a date.
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
* **Every launch plans again.** The train task plans the parent, the role and the tokenizer check
  at each (re)launch, not once: between a failed try and its retry another night may have joined.
  A night whose planned parent changed restarts from the new parent (its checkpoints were trained
  from the old one).
* **The gate.** A night held (or rolled back) after its evaluation (``stoker.gate``) stays in the line's
  history but is never a parent: the head and every later night continue the last night not held.
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
from stoker.layout import CHECKPOINT_COMPLETE, FORK_FILE, LineLayout, NightFiles, complete_checkpoints
from stoker.manifest import atomic_write_json, sha256_file


@dataclass(kw_only=True, slots=True)
class LineSettings:
    """A corpus's ``train`` settings that concern its model line."""

    line: str
    init: str = "random"
    older_nights: str = "branch"
    optimizer: str = "carry"
    lr_schedule: str = "wsd"
    cooldown_share: float = 0.1
    replay: float = 0.0

    @classmethod
    def of(cls, train: Any) -> LineSettings:
        return cls(line=train.line, init=train.init, older_nights=train.older_nights, optimizer=train.optimizer,
                   lr_schedule=train.lr_schedule, cooldown_share=train.cooldown_share, replay=train.replay)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def layout(self) -> LineLayout:
        return LineLayout.of(self.line)


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
    corpus: str = ""
    """The parent night's corpus (kind ``night``)."""
    role: str = "head"
    """What the night being trained becomes: ``head`` or ``branch`` (the head cannot take it)."""

    def describe(self) -> str:
        if self.kind == "night":
            return f"night {self.ds} of corpus {self.corpus or '?'} in line {self.line} ({self.path})"
        return f"a Hugging Face model ({self.path})" if self.kind == "hf" else "random weights (the recipe's shape)"

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


def blessed(record: dict[str, Any]) -> bool:
    """Whether a night may be continued: not held or rolled back by the gate (stoker.gate)."""
    return (record.get("decision") or {}).get("decision") not in ("held", "rolled_back")


def head(line: LineLayout) -> dict[str, Any] | None:
    """The record of the night that joined last as the line's continuation (and was not held), None before
    the first."""
    heads = [r for r, _ in joined_nights(line) if r.get("parent", {}).get("role", "head") == "head" and blessed(r)]
    return heads[-1] if heads else None


def _holds(record: dict[str, Any], ds: str, corpus: str) -> bool:
    """Whether the model of ``record`` was trained on a publication of night (ds, corpus)."""
    return any(e.get("ds") == ds and e.get("corpus") == corpus for e in record.get("lineage", []))


def plan(line: LineLayout, ds: str, corpus: str, init: str, older_nights: str) -> Parent:
    """The parent of night (``ds``, ``corpus``) and its role (see the module's rules); refuses a night
    the head cannot take if told to."""
    others = [(r, n) for r, n in joined_nights(line) if (r["ds"], r.get("corpus")) != (ds, corpus) and blessed(r)]
    heads = [(r, n) for r, n in others if r.get("parent", {}).get("role", "head") == "head"]
    top = heads[-1] if heads else None
    if top is not None and top[0]["ds"] <= ds and not _holds(top[0], ds, corpus):
        return _night_parent(line, top, "head")
    if top is not None:
        if older_nights == "refuse":
            raise StokerError(
                f"night {ds} of corpus {corpus} cannot continue line {line.name}'s head, night {top[0]['ds']} of "
                f"corpus {top[0].get('corpus')} (train.older_nights: refuse): the head is newer, or already holds "
                f"an earlier publication of this night; the line only moves forward. To train it anyway set "
                f"train.older_nights: branch (it trains from the newest night before it and the head stays), or "
                f"train it on a line of its own (train.line)")
        before = [(r, n) for r, n in others if r["ds"] <= ds and not _holds(r, ds, corpus)]
        if before:
            return _night_parent(line, max(before, key=lambda rn: (rn[0]["ds"], _order(rn[0]))), "branch")
    return _init_parent(line, init, "branch" if top is not None else "head")


def _night_parent(line: LineLayout, found: tuple[dict[str, Any], NightFiles], role: str) -> Parent:
    record, night = found
    return Parent(kind="night", line=line.name, path=str(night.folder), ds=record["ds"],
                  corpus=str(record.get("corpus", "")), role=role)


def _init_parent(line: LineLayout, init: str, role: str) -> Parent:
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
    partition_sequences: dict[str, int] = field(default_factory=dict)
    """Per partition: the sequences in its range (a replay draws by record: stoker/replay.py)."""
    trained_at: str = ""
    seq: int = 0
    """Join order in the line (1 for its first night); set when the night joins."""
    replayed: int = 0
    """Sequences of earlier nights trained again in this night (``train.replay``)."""
    lineage: list[dict[str, Any]] = field(default_factory=list)
    """Every night of the model's history, oldest first, this one last (plus its HF start, if any)."""

    def entry(self) -> dict[str, Any]:
        keys = ("ds", "corpus", "topic", "sequences", "tokens", "steps", "first_loss", "last_loss", "offsets",
                "partition_sequences")
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
              partition_sequences={str(p.partition): p.sequences for p in manifest.partitions},
              replayed=int(summary.get("sequences_replayed", 0)),
              trained_at=datetime.now(UTC).isoformat(timespec="seconds"))
    n.lineage = [*history, n.entry()]
    return n


def _link(src: str | Path, dst: str | Path) -> None:
    """A hard link where the file system allows (a checkpoint is big), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _link_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, copy_function=_link)


def promote(line: LineLayout, night: Night, checkpoints: Path, export: Path, holdout: Path | None = None,
            trunk: Path | None = None, replay_store: Path | None = None) -> NightFiles:
    """Record a finished night in its line: its final complete checkpoint, its HF export with a model
    card, its held-out documents, its record last, in a new folder of the line's store; then the night's
    link is swapped to it in one rename, so a reader (or a crash) sees the old night or the whole new one.
    ``wsd``: the checkpoint is the state before the cooldown (``FORK_FILE``) and ``trunk`` its weights, which
    the next night continues; the export is the cooled-down model.
    Store folders that no link names (a replaced night, a crash's leftovers) are removed."""
    complete = complete_checkpoints(checkpoints)
    if not complete:
        raise StokerError(f"{checkpoints}: no complete checkpoint to promote (none marked "
                          f"{CHECKPOINT_COMPLETE}): the night's trainer did not finish saving")
    fork = checkpoints / FORK_FILE
    if trunk is not None and fork.is_file():
        complete = [json.loads(fork.read_text())["tag"]]
        if not (checkpoints / complete[0] / CHECKPOINT_COMPLETE).is_file():
            raise StokerError(f"{fork}: names checkpoint {complete[0]}, which is not complete")
    final = line.night(night.ds, night.corpus)
    night.seq = max((int(r.get("seq", 0)) for r, _ in joined_nights(line)), default=0) + 1
    new = NightFiles(line.store / f"{final.folder.name}.{night.seq}.{os.getpid()}")
    shutil.rmtree(new.folder, ignore_errors=True)
    new.checkpoint.mkdir(parents=True)
    _link_tree(checkpoints / complete[-1], new.checkpoint / complete[-1])
    (new.checkpoint / "latest").write_text(complete[-1])
    _link_tree(export, new.model)
    if trunk is not None and fork.is_file():
        _link_tree(trunk, new.trunk)
    if holdout is not None and holdout.is_dir():
        _link_tree(holdout, new.holdout)
    if replay_store is not None and replay_store.is_file():
        _link(replay_store, new.replay_store)
    new.card.unlink(missing_ok=True)
    new.card.write_text(model_card(night))
    atomic_write_json(new.record, asdict(night))
    if final.folder.is_dir() and not final.folder.is_symlink():  # a night of an earlier Stoker: into the store
        final.folder.rename(line.store / f"{final.folder.name}.legacy")
    link = final.folder.with_name(f".{final.folder.name}.link{os.getpid()}")
    link.unlink(missing_ok=True)
    link.symlink_to(Path(".store") / new.folder.name)
    os.replace(link, final.folder)
    _clean_store(line)
    return final


def _clean_store(line: LineLayout) -> None:
    named = {p.resolve() for p in line.nights_dir.iterdir() if p.is_symlink()}
    for folder in line.store.iterdir():
        if folder.resolve() not in named:
            shutil.rmtree(folder, ignore_errors=True)


def _loss(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def _of(parent: dict[str, Any]) -> str:
    return f" (corpus `{parent['corpus']}`)" if parent.get("corpus") else ""


def model_card(n: Night) -> str:
    """A README a user can read: the line, its parent, every night it was trained on, the recipe, the loss."""
    start = n.lineage[0].get("init", "random") if n.lineage and "init" in n.lineage[0] else "random"
    rows = [e for e in n.lineage if "ds" in e]
    lines = [
        "---", "library_name: transformers", "tags: [stoker, continued-pretraining]", "---", "",
        f"# Model line `{n.line}`, night {n.ds}", "",
        f"Trained by Stoker from corpus `{n.corpus}` on {n.trained_at}. Parent: "
        + (f"night {n.parent['ds']}{_of(n.parent)} of line `{n.parent['line']}`." if n.parent["kind"] == "night"
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
