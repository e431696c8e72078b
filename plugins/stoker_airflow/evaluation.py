"""The night's evaluation task: the night's model and the model it continued, scored on the same held-out
documents (training/evaluate.py, run as a subprocess where the task runs: the ``train.queue`` worker).

Sets: ``night`` (this night's held-out documents) and ``forgetting:<ds>.<corpus>`` for the line's earlier
nights that kept theirs (the latest ``forgetting_nights`` of the night's lineage): what this night cost the
earlier data. The baseline is the night's parent (the line's head it continued), absent for a line's first
night from random weights. The figures go to the run's ``eval.json``; the run summary carries them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator

from stoker import paths


def baseline_model(parent: dict[str, Any]) -> Path | None:
    """The Hugging Face folder of what the night continued: a night of the line, or a given HF model."""
    from stoker.layout import NightFiles

    if parent.get("kind") == "night":
        return NightFiles(Path(parent["path"])).model
    return Path(parent["path"]) if parent.get("kind") == "hf" else None


def forgetting_sets(line: str, ds: str, corpus: str, count: int) -> dict[str, Path]:
    """The held-out folders of the latest ``count`` earlier nights in this night's lineage that kept one."""
    from stoker.layout import LineLayout

    layout = LineLayout.of(line)
    record = layout.night(ds, corpus).record
    lineage = json.loads(record.read_text()).get("lineage", []) if record.is_file() else []
    out: dict[str, Path] = {}
    for entry in reversed(lineage):
        if not entry.get("ds") or (entry.get("ds"), entry.get("corpus")) == (ds, corpus):
            continue  # the init (random or HF) and this night itself
        held = layout.night(entry["ds"], entry.get("corpus", "")).holdout
        if held.is_dir() and len(out) < count:
            out[f"forgetting:{entry['ds']}.{entry.get('corpus', '')}"] = held
    return out


class NightEvalOperator(BaseOperator):
    """Scores the night's model, and the model it continued, on held-out data; skipped (with the reason)
    when the night held nothing out (``eval.holdout_per_mille`` 0, or a drop too small for one document)."""

    template_fields: Sequence[str] = ("manifest_path",)

    def __init__(self, *, manifest_path: str, forgetting_nights: int = 3, timeout_s: int = 3600,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.manifest_path = manifest_path
        self.forgetting_nights = forgetting_nights
        self.timeout_s = timeout_s

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowSkipException

        from stoker.layout import RunLayout
        from stoker.manifest import read_manifest
        from stoker.plan import read_plan

        m = read_manifest(self.manifest_path)
        run = RunLayout.of_manifest(self.manifest_path)
        run.evaluation.unlink(missing_ok=True)  # an earlier try's figures are not this one's
        if not m.holdout.get("docs"):
            raise AirflowSkipException(f"{m.run_id}: no document was held out (eval.holdout_per_mille = "
                                       f"{m.holdout.get('per_mille', 0)}): nothing to evaluate on")
        files = run.trainer(m.topic)
        parent = json.loads(files.parent.read_text()) if files.parent.is_file() else {}
        baseline = baseline_model(parent)
        sets = {"night": run.holdout}
        if run.plan.is_file():
            sets.update(forgetting_sets(read_plan(run.plan).corpus.train.line, m.ds, m.corpus, self.forgetting_nights))
        cmd = [sys.executable, "-m", "training.evaluate", "--model", str(files.export), "--out", str(run.evaluation),
               *(["--baseline", str(baseline)] if baseline else []),
               *[a for name, folder in sets.items() for a in ("--set", f"{name}={folder}")]]
        self.log.info("evaluating %s against %s on %s", files.export, baseline or "no baseline (random init)",
                      ", ".join(sets))
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        out = subprocess.run(cmd, cwd=paths.project_root(), env=env, capture_output=True, text=True,
                             timeout=self.timeout_s)
        if out.returncode != 0:
            raise RuntimeError(f"evaluation failed (exit {out.returncode}): {out.stderr[-3000:]}")
        result = json.loads(run.evaluation.read_text())
        for name, figures in result["sets"].items():
            a = figures["all"]
            self.log.info("%s: %d docs, %.4f bits/byte ± %.4f%s", name, a["docs"], a["bpb"], a["stderr"],
                          f"; baseline {a['baseline_bpb']:.4f}, change {a['delta']:+.4f} ± {a['delta_stderr']:.4f}"
                          if "delta" in a else "")
        return {name: f["all"] for name, f in result["sets"].items()}
