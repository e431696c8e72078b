"""What a night starts from: the line's head, a branch point, or the line's init (the rules are
:mod:`stoker.lines.nights`), and whether the corpus tokenizer fits that model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stoker import paths
from stoker.exceptions import ConfigError, StokerError
from stoker.files import sha256_file
from stoker.layout import LineLayout, NightFiles
from stoker.lines.ledger import blessed, state
from stoker.lines.nights import Decision, Kind, Parent, Role, _order, joined_nights, read_night
from stoker.run.tokenizer import TokenizerFacts


def _holds(record: dict[str, Any], ds: str, corpus: str) -> bool:
    """Whether the model of ``record`` was trained on a publication of night (ds, corpus)."""
    return any(e.get("ds") == ds and e.get("corpus") == corpus for e in record.get("lineage", []))


def choose_parent(line: LineLayout, ds: str, corpus: str, init: str, older_nights: str) -> Parent:
    """The parent of night (``ds``, ``corpus``) and its role (see the module's rules); refuses a night
    the head cannot take if told to."""
    # a promoted night, or a branch (decided so as it joined): a backfill of several old nights is a chain of
    # branches, each continuing the one before it; a branch is never a head, so the head is always promoted
    others = [(r, n) for r, n in joined_nights(line) if (r["ds"], r.get("corpus")) != (ds, corpus)
              and (blessed(r) or state(r) == Decision.BRANCH)]
    heads = [(r, n) for r, n in others if r.get("parent", {}).get("role", Role.HEAD) == Role.HEAD]
    top = heads[-1] if heads else None
    if top is not None and top[0]["ds"] <= ds and not _holds(top[0], ds, corpus):
        return _night_parent(line, top, Role.HEAD)
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
            return _night_parent(line, max(before, key=lambda rn: (rn[0]["ds"], _order(rn[0]))), Role.BRANCH)
    return _init_parent(line, init, Role.BRANCH if top is not None else Role.HEAD)


def _night_parent(line: LineLayout, found: tuple[dict[str, Any], NightFiles], role: Role) -> Parent:
    record, night = found
    return Parent(kind=Kind.NIGHT, line=line.name, path=str(night.folder), ds=record["ds"],
                  corpus=str(record.get("corpus", "")), role=role)


def _init_parent(line: LineLayout, init: str, role: Role) -> Parent:
    if init == "random":
        return Parent(kind=Kind.RANDOM, line=line.name, role=role)
    folder = paths.resolve_local(init)
    if not (folder / "config.json").is_file():
        raise ConfigError(f"train.init = {init!r}: {folder} is not a Hugging Face model folder (no config.json); "
                          "use 'random' or a local folder saved with save_pretrained")
    return Parent(kind=Kind.HF, line=line.name, path=str(folder), role=role)


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
