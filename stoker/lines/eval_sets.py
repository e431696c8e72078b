"""The held-out sets a night is scored on: its own and the latest earlier nights' of its lineage,
against the model it continued (its baseline).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def baseline_model(parent: dict[str, Any]) -> Path | None:
    """The Hugging Face folder of what a night continued (its trainer's ``parent.json``): a night of the line,
    or a given HF model; None for random weights."""
    from stoker.layout import NightFiles

    if parent.get("kind") == "night":
        return NightFiles(Path(parent["path"])).model
    return Path(parent["path"]) if parent.get("kind") == "hf" else None


def eval_sets(night: Path, parent: dict[str, Any], ds: str, corpus: str, forgetting_nights: int) -> dict[str, Path]:
    """The held-out sets a night is scored on: ``night`` (its own, the folder ``night``, when it holds a document)
    and, for a night that continued a night of its line, ``forgetting:<ds>.<corpus>`` for the latest
    ``forgetting_nights`` nights of the parent's lineage (the parent included) that kept at least one document:
    what this night cost the earlier data. A set with no document is never a figure; no set at all leaves the
    night to ``eval.ungated``."""
    import json

    from stoker.layout import LineLayout, NightFiles
    from stoker.run.holdout import documents

    sets = {"night": night} if documents(night) else {}
    if parent.get("kind") != "night":
        return sets
    record = NightFiles(Path(parent["path"])).record
    lineage = json.loads(record.read_text()).get("lineage", []) if record.is_file() else []
    line = LineLayout.of(parent["line"])
    earlier = 0
    for entry in reversed(lineage):
        if earlier >= forgetting_nights:
            break
        if not entry.get("ds") or (entry["ds"], entry.get("corpus", "")) == (ds, corpus):
            continue  # the init (random or HF), and an earlier publication of this very night
        held = line.night(entry["ds"], entry.get("corpus", "")).holdout
        if documents(held):  # a night that held out no document has no set: it never holds a later night
            sets[f"forgetting:{entry['ds']}.{entry.get('corpus', '')}"] = held
            earlier += 1
    return sets


def mixture_sets(mix_plan: str | Path | None, lead: str) -> dict[str, Path]:
    """A mixture night's other components' held-out documents, ``night:<corpus>`` (its lead's are ``night``); none
    for a night of one corpus (``mix_plan`` None). A component that held out no document has no set."""
    from stoker.layout import RunLayout
    from stoker.lines.mix_plan import read_plan
    from stoker.run.holdout import documents

    if not mix_plan:
        return {}
    plan = read_plan(mix_plan)
    held = {k: RunLayout.of_manifest(p).holdout for k, p in sorted(plan.manifests.items()) if k != lead}
    return {f"night:{k}": folder for k, folder in held.items() if documents(folder)}
