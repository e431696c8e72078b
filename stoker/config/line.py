"""Validated models of ``corpora/lines/<name>.yaml``: a model line trained on a mixture of its corpora (issue 35).

A line without a file is what it always was: each corpus naming it in ``train.line`` trains its own nights on it.
A line file gives the line a ``mix:`` (:class:`stoker.lines.mixture.Mix`: the target shares of its corpora, the
repeat cap, what a short corpus does) and a ``deadline:``: how long the night waits for a corpus that has not
published, and what it does then. Every corpus of the mix must be a corpus file whose ``train.line`` is this line
(:func:`check_line`), since their nights are the mixture's components and their tokenizer, ``seq_len`` and train
settings must agree.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from stoker.config.schema import build, fail, jsonable
from stoker.exceptions import ConfigError
from stoker.lines.mixture import REPLAY, Mix

WHEN_MISSING = ("train_rest", "wait")


@dataclass(kw_only=True, slots=True)
class DeadlineConfig:
    after_s: int = 6 * 3600
    """How long after the night's first corpus published the line waits for the others (seconds, >= 0)."""
    when_missing: str = "train_rest"
    """What a night does at the deadline with corpora still missing: ``train_rest`` trains the others at their
    shares scaled up to sum to 1, the missing named in the plan and the summary; ``wait`` keeps waiting for
    them (the run stays up for reschedule, saying who is late)."""

    def __post_init__(self) -> None:
        if self.after_s < 0:
            raise fail("deadline.after_s", self.after_s, "must be >= 0 seconds")
        if self.when_missing not in WHEN_MISSING:
            raise fail("deadline.when_missing", self.when_missing, f"must be one of {', '.join(WHEN_MISSING)}")


@dataclass(kw_only=True, slots=True)
class LineConfig:
    name: str
    """The line's name: the file's, and the ``train.line`` of every corpus of its mix."""
    mix: Mix
    description: str = ""
    """What the line is for, in a sentence (shown with its nights)."""
    deadline: DeadlineConfig = field(default_factory=DeadlineConfig)
    lead: str = ""
    """The corpus whose night folder holds the mixture night's trainer, and whose train settings (recipe, world
    size, optimizer, schedule) it trains with (default: the largest share; ties: the first name)."""

    def __post_init__(self) -> None:
        if REPLAY in self.mix.shares:
            raise fail("mix.shares.replay", self.mix.shares[REPLAY], "replay as a mixture component is not built yet: "
                       "leave it out of mix.shares (train.replay still mixes replay into single-corpus nights)")
        if not self.lead:
            self.lead = min(self.mix.shares, key=lambda k: (-self.mix.shares[k], k))
        if self.lead not in self.mix.shares:
            raise fail("lead", self.lead, f"must be one of the mix's corpora {sorted(self.mix.shares)}")

    def to_dict(self) -> dict[str, Any]:
        return jsonable(dataclasses.asdict(self))


def lines_dir(corpora: Path) -> Path:
    return corpora / "lines"


def load_line(path: str | Path) -> LineConfig:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, OSError) as e:
        raise ConfigError(f"{path}: cannot read the line config: {e}") from None
    if isinstance(data, dict):
        data.setdefault("name", path.stem)
    try:
        line = build(LineConfig, data, "")
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    if line.name != path.stem:
        raise ConfigError(f"{path}: name = {line.name!r} must equal the file name {path.stem!r}")
    return line


def check_line(line: LineConfig, corpora: dict[str, Any]) -> list[str]:
    """What keeps ``line`` from mixing its corpora (``corpora``: name → CorpusConfig): each must exist, train on
    this line, and pack alike."""
    errors = [f"line {line.name}: mix.shares names {k}, which has no corpus file (corpora/{k}.yaml)"
              for k in line.mix.shares if k not in corpora]
    errors += [f"line {line.name}: corpus {k} trains line {corpora[k].train.line!r}; set its train.line to "
               f"{line.name!r} to mix it here" for k in line.mix.shares if k in corpora
               and corpora[k].train.line != line.name]
    packed = {k: (corpora[k].pack.seq_len, corpora[k].tokenizer.path) for k in line.mix.shares if k in corpora}
    if len(set(packed.values())) > 1:
        errors.append(f"line {line.name}: its corpora pack differently (seq_len, tokenizer): {packed}; a batch mixes "
                      "their rows, so they must agree")
    return errors


def load_lines(corpora_folder: Path, corpora: dict[str, Any]) -> tuple[list[LineConfig], list[str]]:
    """Every ``lines/*.yaml`` under ``corpora_folder`` that validates and mixes ``corpora`` (name → CorpusConfig),
    and a message for each that does not (one broken line must not take the others down)."""
    good, errors = [], []
    for p in sorted(lines_dir(corpora_folder).glob("*.yaml")):
        try:
            line = load_line(p)
        except ConfigError as e:
            errors.append(str(e))
            continue
        found = check_line(line, corpora)
        if found:
            errors += [f"{p}: {e}" for e in found]
        else:
            good.append(line)
    return good, errors


def mixed_corpora(corpora_folder: Path) -> dict[str, str]:
    """Corpus → the line file whose mix names it, valid or not: such a corpus publishes its nights for the line's
    DAG and never trains them alone (a line with an error trains nothing until it is fixed; its error says why)."""
    out: dict[str, str] = {}
    for p in sorted(lines_dir(corpora_folder).glob("*.yaml")):
        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8"))
        except (yaml.YAMLError, OSError):
            continue
        shares = ((data or {}).get("mix") or {}).get("shares") if isinstance(data, dict) else None
        if isinstance(shares, dict):
            out.update({str(k): p.stem for k in shares})
    return out
