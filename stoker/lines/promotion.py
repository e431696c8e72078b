"""A finished night recorded in its line: its checkpoint, export, held-out set and record swapped
in with one rename, and the model card a person reads.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from stoker.exceptions import StokerError
from stoker.layout import CHECKPOINT_COMPLETE, FORK_FILE, LineLayout, NightFiles, complete_checkpoints
from stoker.lines import ledger
from stoker.lines.nights import Night
from stoker.lines.replay_rows import rows_present
from stoker.run.holdout import documents


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
    The night joins pending (:mod:`stoker.lines.ledger`): its gate, rule or a person decides it.
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
    ledger.admit(line, night)  # its join number; a head continues a promoted night
    new = NightFiles(line.store / f"{final.folder.name}.{night.seq}.{os.getpid()}")
    shutil.rmtree(new.folder, ignore_errors=True)
    new.checkpoint.mkdir(parents=True)
    _link_tree(checkpoints / complete[-1], new.checkpoint / complete[-1])
    (new.checkpoint / "latest").write_text(complete[-1])
    _link_tree(export, new.model)
    if trunk is not None and fork.is_file():
        _link_tree(trunk, new.trunk)
    if holdout is not None and documents(holdout):  # an empty set is no evaluation set of the line
        _link_tree(holdout, new.holdout)
    if replay_store is not None and rows_present(replay_store):
        _link_tree(replay_store, new.replay_store)
    new.card.unlink(missing_ok=True)
    new.card.write_text(model_card(night))
    ledger.write_new(new.record, ledger.new_record(night))
    if final.folder.is_dir() and not final.folder.is_symlink():  # a night of an earlier Stoker: into the store
        final.folder.rename(line.store / f"{final.folder.name}.legacy")
    link = final.folder.with_name(f".{final.folder.name}.link{os.getpid()}")
    link.unlink(missing_ok=True)
    link.symlink_to(Path(".store") / new.folder.name)
    os.replace(link, final.folder)
    _clean_store(line)
    ledger.joined(line, night)  # pending nights it continued past are passed over
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
    mixed = [e for e in rows if e.get("mixture")]
    if mixed:
        lines += ["## Mixture nights", "", "A night over several corpora: the rows each trained (its label-token "
                  "share, and the share asked for), of what it published.", "",
                  "| night | corpus | topic | rows | of published | token share | target |",
                  "|---|---|---|---|---|---|---|"]
        for e in mixed:
            for k, c in e["mixture"]["components"].items():
                lines.append(f"| {e['ds']} | {k} | `{c['topic']}` | {c['rows']:,} | {c['published']:,} | "
                             f"{c['token_share']:.4f} | {c['target']:.4f} |")
            missing = e["mixture"].get("missing", {})
            lines += [f"| {e['ds']} | {k} | — | not trained: {why} | | | |" for k, why in missing.items()]
        lines.append("")
    return "\n".join(lines)
