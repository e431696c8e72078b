"""The night's evaluation task: the night's model and the model it continued, scored on the same held-out
documents (training/evaluate.py). The trainer scores them right after its export, while torch is loaded
(its ``eval.json``); this task takes those figures when they are of this export, this baseline and these
sets, and otherwise scores in a process of its own where it runs (the ``train.queue`` worker).

Sets: ``night`` (this night's held-out documents) and ``forgetting:<ds>.<corpus>`` for the line's earlier
nights that kept theirs (the latest ``forgetting_nights`` of the night's lineage): what this night cost the
earlier data. A mixture night (a line's DAG) is scored on every component's held-out documents too:
``night`` is its lead's, ``night:<corpus>`` each other's, and the gate holds it when any of them regresses.
The baseline is the night's parent (the line's head it continued), absent for a line's first night from
random weights. The figures go to the run's ``eval.json``; the run summary carries them.
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
from stoker.files import atomic_write_json


def trainer_scores(files: Any, sets: dict[str, Path], baseline: Path | None) -> dict[str, Any] | None:
    """The scores the trainer wrote right after its export (training/evaluate.py's ``evaluate_night``), when
    they are of this export (not older than it), against this baseline, on exactly these sets."""
    try:
        result: dict[str, Any] = json.loads(files.evaluation.read_text())
        fresh = files.evaluation.stat().st_mtime >= (files.export / "config.json").stat().st_mtime
    except (OSError, ValueError):
        return None
    same = (result.get("model") == str(files.export) and result.get("baseline") == (str(baseline) if baseline
            else None) and {k: v.get("path") for k, v in result.get("sets", {}).items()} ==
            {k: str(v) for k, v in sets.items()})
    return result if fresh and same else None


def xcom_safe(value: Any) -> Any:
    """``value`` with every float that is not finite as None: a diverged model's NaN bits per byte stays in
    ``eval.json`` (and holds the night), but Airflow stores a task's return value as strict JSON, where a NaN
    failed the task on every try."""
    import math

    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: xcom_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [xcom_safe(v) for v in value]
    return value


class NightEvalOperator(BaseOperator):
    """Scores the night's model, and the model it continued, on held-out data, and records the decision in the
    line (:mod:`stoker.lines.ledger`); a night with no document to score (``eval.holdout_per_mille`` 0, or a drop
    too small for one document, and no earlier night's set) is decided by ``eval.ungated``."""

    template_fields: Sequence[str] = ("manifest_path", "mix_plan_path")

    def __init__(self, *, manifest_path: str, timeout_s: int = 3600, mix_plan_path: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.manifest_path = manifest_path
        self.timeout_s = timeout_s
        self.mix_plan_path = mix_plan_path

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        from stoker.layout import RunLayout
        from stoker.run.manifest import read_manifest
        from stoker.run.plan import read_plan
        from stoker_airflow.lines import give_back_line_lease

        m = read_manifest(self.manifest_path)
        run = RunLayout.of_manifest(self.manifest_path)
        cfg = read_plan(run.plan).corpus
        run.evaluation.unlink(missing_ok=True)  # an earlier try's figures are not this one's
        try:
            result = self.evaluate(m, run, cfg)
            result["decision"] = self.gate(m, run, cfg, result)
            atomic_write_json(run.evaluation, result)
        except AirflowFailException:
            give_back_line_lease(cfg.train, m, context["ti"])  # never tried again: the next night may launch
            raise
        except Exception:
            # a try Airflow will run again keeps the lease the train task handed over: the line's next night
            # must not train from a night whose gate has not yet decided
            if not self.retries_left(context):
                give_back_line_lease(cfg.train, m, context["ti"])
            raise
        give_back_line_lease(cfg.train, m, context["ti"])  # decided: the line's next night may launch
        return xcom_safe({"decision": result.get("decision"), **{name: f["all"] for name, f in result["sets"].items()}})

    def retries_left(self, context: Any) -> bool:
        """Whether Airflow runs this task again after a failed try (its ``retries`` not yet spent)."""
        return int(context["ti"].try_number) <= int(self.retries or 0)

    def evaluate(self, m: Any, run: Any, cfg: Any) -> dict[str, Any]:
        """The figures (``eval.json``); no set with a document to score: none, and ``eval.ungated`` decides."""
        from stoker.lines.eval_sets import baseline_model, eval_sets, mixture_sets

        files = run.trainer(m.topic)
        parent = json.loads(files.parent.read_text()) if files.parent.is_file() else {}
        baseline = baseline_model(parent)
        sets = eval_sets(run.holdout, parent, m.ds, m.corpus, cfg.eval.forgetting_nights)
        sets |= mixture_sets(self.mix_plan_path, m.corpus)
        if not sets:
            self.log.warning("%s: no held-out document to score it on (its own: %d, eval.holdout_per_mille %s; no "
                             "earlier night's set): eval.ungated (%s) decides", m.run_id, m.holdout.get("docs", 0),
                             m.holdout.get("per_mille", 0), cfg.eval.ungated)
            return {"sets": {}, "ungated": True}
        done = trainer_scores(files, sets, baseline)
        if done is not None:
            self.log.info("the trainer scored %s against %s on %s right after its export (%.1f s)", files.export,
                          baseline or "no baseline (random init)", ", ".join(sets), done.get("seconds", 0))
            atomic_write_json(run.evaluation, done)
        else:
            self.score(files, sets, baseline, run)
        result: dict[str, Any] = json.loads(run.evaluation.read_text())
        if cfg.eval.lm_eval_tasks:
            result["lm_eval"] = self.harness(files, baseline, cfg.eval, run)
            atomic_write_json(run.evaluation, result)
        for name, figures in result["sets"].items():
            a = figures["all"]
            self.log.info("%s: %d docs, %.4f bits/byte ± %.4f%s", name, a["docs"], a["bpb"], a["stderr"],
                          f"; blessed {a['baseline_bpb']:.4f}, change {a['delta']:+.4f} ± {a['delta_stderr']:.4f}"
                          if "delta" in a else "")
        return result

    def score(self, files: Any, sets: dict[str, Path], baseline: Path | None, run: Any) -> None:
        """The scores in a process of this task's own: the trainer wrote none for this export (it failed to,
        or it is of an earlier Stoker)."""
        self.log.info("evaluating %s against %s on %s", files.export, baseline or "no baseline (random init)",
                      ", ".join(sets))
        self._run("training.evaluate", files.export, run.evaluation, baseline,
                  [a for name, folder in sets.items() for a in ("--set", f"{name}={folder}")])

    def _run(self, module: str, model: Path, out: Path, baseline: Path | None, args: list[str]) -> None:
        """``python -m <module> --model --out [--baseline] ...`` offline, in a process of this task's own."""
        cmd = [sys.executable, "-m", module, "--model", str(model), "--out", str(out),
               *(["--baseline", str(baseline)] if baseline else []), *args]
        done = subprocess.run(cmd, cwd=paths.project_root(), capture_output=True, text=True, timeout=self.timeout_s,
                              env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
        if done.returncode != 0:
            raise RuntimeError(f"{module} failed (exit {done.returncode}): {done.stderr[-3000:]}")

    def harness(self, files: Any, baseline: Path | None, cfg: Any, run: Any) -> dict[str, Any]:
        """``eval.lm_eval_tasks`` on the export and the baseline, in a process of this task's own."""
        run.lm_eval.unlink(missing_ok=True)
        self.log.info("lm-eval tasks %s on %s and %s", ", ".join(cfg.lm_eval_tasks), files.export,
                      baseline or "no baseline (random init)")
        self._run("training.lm_eval_tasks", files.export, run.lm_eval, baseline, [
            *(["--include", paths.expand(cfg.lm_eval_include)] if cfg.lm_eval_include else []),
            *(["--limit", str(cfg.lm_eval_limit)] if cfg.lm_eval_limit else []),
            *[a for task in cfg.lm_eval_tasks for a in ("--task", task)]])
        result: dict[str, Any] = json.loads(run.lm_eval.read_text())
        for task, row in result["tasks"].items():
            for name, m in row["metrics"].items():
                self.log.info("%s %s: %.4f%s", task, name, m["value"],
                              f" (blessed {m['baseline']:.4f})" if "baseline" in m else "")
        return result

    def gate(self, m: Any, run: Any, cfg: Any, result: dict[str, Any]) -> dict[str, Any] | None:
        """The decision on the joined night, recorded in the line (stoker.lines.gate)."""
        from stoker.layout import LineLayout
        from stoker.lines.gate import decide, record_decision, ungated
        from stoker.lines.nights import read_night

        night = LineLayout.of(cfg.train.line).night(m.ds, m.corpus)
        record = read_night(night) if night.record.is_file() else {}
        if record.get("topic") != m.topic:
            self.log.warning("night %s of %s is not in line %s: no decision", m.ds, m.corpus, cfg.train.line)
            return None
        if result.get("ungated"):
            decision = ungated(cfg.eval.ungated, f"no held-out document to score night {m.ds}.{m.corpus} on")
        else:
            decision = decide(result, record.get("parent", {}).get("role", "head"), cfg.eval.gate_k,
                              cfg.eval.max_regression, cfg.eval.max_forgetting)
        decision = record_decision(LineLayout.of(cfg.train.line), m.ds, m.corpus, result, decision)
        export_card = run.trainer(m.topic).export / "README.md"
        if export_card.parent.is_dir():  # the run's own export carries the card too (a new file, never a link)
            export_card.unlink(missing_ok=True)
            export_card.write_text(night.card.read_text())
        log = self.log.warning if decision["decision"] == "held" else self.log.info
        log("night %s of %s: %s by %s: %s", m.ds, m.corpus, decision["decision"], decision["by"], decision["why"])
        return decision
