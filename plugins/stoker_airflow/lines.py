"""The model line around a refresh's tasks (:mod:`stoker.lines`): before Spark runs, the night's parent
is planned and the corpus tokenizer checked against it; at the trainer's first launch the parent is
fixed in the trainer's folder (every retry starts from the same model); when the train task
succeeds, the night joins its line."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from stoker.layout import LineLayout, NightFiles, TrainerFiles
from stoker.lines import Parent, check_agreement, model_card, night_record, plan, promote, tokenizer_facts

log = logging.getLogger("stoker.lines")


@dataclass(kw_only=True, slots=True)
class LineSettings:
    """A corpus's ``train`` settings that concern its model line."""

    line: str
    init: str = "random"
    older_nights: str = "branch"
    optimizer: str = "carry"
    lr_schedule: str = "rewarm"

    @classmethod
    def of(cls, train: Any) -> LineSettings:
        return cls(line=train.line, init=train.init, older_nights=train.older_nights, optimizer=train.optimizer,
                   lr_schedule=train.lr_schedule)

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @property
    def layout(self) -> LineLayout:
        return LineLayout.of(self.line)


def _fail(e: Exception) -> Exception:
    from airflow.sdk.exceptions import AirflowFailException

    return AirflowFailException(str(e))  # a retry cannot fix a config or a line decision


def check_before_publish(cfg: Any, ds: str) -> Parent:
    """Plan the night and check that the corpus tokenizer fits the model it continues, before any data
    moves. A missing tokenizer file is left to the Spark job, which says how to make it."""
    from stoker import paths
    from stoker.exceptions import StokerError

    settings = LineSettings.of(cfg.train)
    try:
        parent = plan(settings.layout, ds, settings.init, settings.older_nights)
        tok = paths.resolve_local(cfg.tokenizer.path)
        if tok.is_file():
            check_agreement(parent, tokenizer_facts(tok, cfg.tokenizer.eos_token, cfg.tokenizer.pad_token))
    except StokerError as e:
        raise _fail(e) from None
    log.info("night %s of line %s continues %s", ds, settings.line, parent.describe())
    return parent


def fixed_parent(settings: LineSettings, files: TrainerFiles, ds: str) -> Parent:
    """The parent recorded at the night's first launch, else planned now and recorded."""
    from stoker.exceptions import StokerError

    if files.parent.is_file():
        return Parent.from_dict(json.loads(files.parent.read_text()))
    try:
        parent = plan(settings.layout, ds, settings.init, settings.older_nights)
    except StokerError as e:
        raise _fail(e) from None
    files.folder.mkdir(parents=True, exist_ok=True)
    files.parent.write_text(json.dumps(parent.to_dict(), indent=2) + "\n")
    return parent


def trainer_args(settings: LineSettings, parent: Parent) -> list[str]:
    init = ["--init-from", parent.path] if parent.kind in ("night", "hf") else []
    return [*init, "--optimizer", settings.optimizer, "--lr-schedule", settings.lr_schedule]


def join_line(settings: LineSettings, manifest: Any, files: TrainerFiles) -> NightFiles:
    """The night finished: its final checkpoint, export, model card and record go into its line."""
    parent = Parent.from_dict(json.loads(files.parent.read_text()))
    summary = json.loads(files.summary.read_text())
    night = night_record(manifest, summary, parent)
    export = Path(summary.get("export") or files.export)
    (export / "README.md").write_text(model_card(night))  # the run's own export carries the card too
    done = promote(settings.layout, night, files.checkpoints, export)
    log.info("night %s joined line %s as its %s (parent: %s); model card %s", manifest.ds, settings.line,
             parent.role, parent.describe(), done.card)
    return done
