"""lm-evaluation-harness tasks on a night's export (``eval.lm_eval_tasks``): the candidate and the model it
continued, on the same tasks and the same documents, in one process.

Offline by construction: the models load from their folders (the export's ``tokenizer.json`` with the model's
EOS and PAD tokens), the harness's dataset loads run with ``HF_DATASETS_OFFLINE=1``, and the harness runs from
the ``eval.lm_eval_include`` folder, so a task YAML's ``data_files`` are read relative to it. A task the harness
does not know fails before any model loads, naming the task and where tasks are looked for.

The figures inform; they do not gate (the gate reads bits per byte on held-out documents).

Usage: ``python -m training.lm_eval_tasks --model HF_DIR [--baseline HF_DIR] --task NAME ... [--include DIR]
[--limit N] --out lm_eval.json``
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any


def load(folder: str) -> tuple[Any, Any]:
    """A model folder as the harness takes it: the model and a fast tokenizer from its ``tokenizer.json``."""
    from transformers import PreTrainedTokenizerFast

    from training.evaluate import load_model

    model = load_model(folder)
    tokenizer_file = Path(folder) / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise FileNotFoundError(f"{folder} has no tokenizer.json: lm-eval tasks need the tokenizer next to the "
                                "model (Stoker's exports carry it; copy the corpus's tokenizer.json there)")
    tok = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file))
    tok.eos_token = tok.convert_ids_to_tokens(model.config.eos_token_id)
    tok.pad_token = tok.convert_ids_to_tokens(model.config.pad_token_id)
    return model, tok


def task_manager(tasks: list[str], include: str | None) -> Any:
    """The harness's tasks plus ``include``'s; every one of ``tasks`` must be among them."""
    from lm_eval.tasks import TaskManager

    if include is not None and not Path(include).is_dir():
        raise FileNotFoundError(f"eval.lm_eval_include = {include!r} is not a folder: point it at the folder of "
                                "your task YAMLs (e.g. {project}/corpora/examples/lm_eval)")
    manager = None
    if include is not None:  # local tasks only: indexing the harness's own ~15,000 YAMLs takes seconds
        manager = TaskManager(include_path=include, include_defaults=False, verbosity="ERROR")
    if manager is None or any(t not in manager.all_tasks for t in tasks):
        manager = TaskManager(include_path=include, verbosity="ERROR")
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        where = f"the harness's own tasks and {include}" if include else "the harness's own tasks (no include)"
        raise ValueError(f"eval.lm_eval_tasks names {unknown}, which is not among {where}: fix the name, or set "
                         "eval.lm_eval_include to the folder holding its YAML")
    return manager


def run(folder: str, tasks: list[str], manager: Any, limit: int | None, batch_size: int) -> dict[str, Any]:
    """Each task's metrics for one model folder: ``{task: {"docs": n, "metrics": {name: {value, stderr}}}}``."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    model, tok = load(folder)
    lm = HFLM(pretrained=model, tokenizer=tok, batch_size=batch_size, device=str(model.device),
              max_length=model.config.max_position_embeddings)
    out = lm_eval.simple_evaluate(model=lm, tasks=list(tasks), task_manager=manager, limit=limit,
                                  log_samples=False, bootstrap_iters=1000, verbosity="ERROR")
    assert out is not None  # only a non-zero rank of a distributed harness run gets None
    figures: dict[str, Any] = {}
    for task in tasks:
        row = out["results"][task]
        metrics = {key.split(",")[0]: {"value": float(value),
                                       "stderr": _number(row.get(key.replace(",", "_stderr,", 1)))}
                   for key, value in row.items() if "," in key and "_stderr," not in key
                   and isinstance(value, (int, float))}
        figures[task] = {"docs": int(out.get("n-samples", {}).get(task, {}).get("effective", 0)), "metrics": metrics}
    return figures


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def compare(candidate: dict[str, Any], baseline: dict[str, Any] | None) -> dict[str, Any]:
    """The candidate's figures with the baseline's beside each metric (``baseline``, ``baseline_stderr``)."""
    if baseline is None:
        return candidate
    for task, row in candidate.items():
        for name, metric in row["metrics"].items():
            was = baseline.get(task, {}).get("metrics", {}).get(name)
            if was is not None:
                metric["baseline"], metric["baseline_stderr"] = was["value"], was["stderr"]
    return candidate


def evaluate_tasks(model_dir: str, tasks: list[str], baseline_dir: str | None = None, include: str | None = None,
                   limit: int | None = None, batch_size: int = 8) -> dict[str, Any]:
    """The candidate, and the baseline if any, on ``tasks``: ``{"model", "baseline", "tasks", "seconds"}``."""
    t0 = time.monotonic()
    model_dir = str(Path(model_dir).resolve())
    baseline_dir = str(Path(baseline_dir).resolve()) if baseline_dir else None
    include = str(Path(include).resolve()) if include else None
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    manager = task_manager(tasks, include)
    if include is not None:
        os.chdir(include)  # a task's data_files are relative to its folder
    figures = run(model_dir, tasks, manager, limit, batch_size)
    base = run(baseline_dir, tasks, manager, limit, batch_size) if baseline_dir else None
    return {"model": model_dir, "baseline": baseline_dir, "limit": limit,
            "tasks": compare(figures, base), "seconds": round(time.monotonic() - t0, 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the candidate: a Hugging Face folder with tokenizer.json")
    ap.add_argument("--baseline", help="run on the same tasks (e.g. the line's blessed model)")
    ap.add_argument("--task", action="append", required=True, help="an lm-eval task name (repeat for more)")
    ap.add_argument("--include", help="a folder of task YAMLs (their data_files relative to it)")
    ap.add_argument("--limit", type=int, help="at most this many documents per task")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--batch-size", type=int, default=8)
    args = ap.parse_args(argv)
    out = args.out.resolve()
    from stoker.files import atomic_write_json

    result = evaluate_tasks(args.model, args.task, args.baseline, args.include, args.limit, args.batch_size)
    atomic_write_json(out, result)
    print(json.dumps({t: {k: v["value"] for k, v in r["metrics"].items()} for t, r in result["tasks"].items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
