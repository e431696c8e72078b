"""Held-out evaluation: bits per byte of a model on held-out sets (:mod:`stoker.run.holdout`), per source file, with
standard errors; a candidate and a baseline scored on the same documents, with their paired difference.

The held-out sequences go through the batch builder the trainer uses (:func:`training.data.batch.make_batch`:
per-document position ids, ``attention_mask=None``, a block-diagonal causal mask), so a document is scored in
the context training gives it. A document's loss is the sum over its tokens that are predicted from its own
earlier tokens in the same window, its EOS included; its first token, and the first token of a window it
continues into, are context only. Bits per byte of a set = Σ loss / (ln 2 · Σ UTF-8 bytes of its documents).

Usage: ``python -m training.evaluate --model HF_DIR [--baseline HF_DIR] --set NAME=HOLDOUT_DIR ... --out eval.json``
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

LN2 = math.log(2)


@dataclass(slots=True)
class HeldOut:
    """One held-out set's documents: source, UTF-8 bytes; and its packed windows with their layout."""

    sources: list[str]
    doc_bytes: np.ndarray
    parts: list[dict[str, Any]]

    @classmethod
    def load(cls, folder: Path) -> HeldOut:
        from stoker.run.holdout import read_part

        parts = [read_part(p) for p in sorted(Path(folder).glob("part-*.npz"))]
        sources = [str(p["sources"][c]) for p in parts for c in p["doc_source"]]
        nbytes = np.concatenate([p["doc_bytes"] for p in parts]) if parts else np.zeros(0, dtype=np.int64)
        return cls(sources=sources, doc_bytes=nbytes, parts=parts)


def part_windows(part: dict[str, Any]) -> tuple[list[Any], np.ndarray, int]:
    """A part's windows as the trainer's packed sequences, its documents' start in the flattened stream, and
    the stream's real length."""
    from stoker.run.records import PackedSequence

    tokens, lengths = part["tokens"], part["doc_tokens"].astype(np.int64)
    width = tokens.shape[1]
    starts = np.cumsum(lengths) - lengths  # a task that held out nothing has an empty part: no document
    total = int(lengths.sum())
    seqs = []
    for i in range(len(tokens)):
        lo = i * width
        inside = starts[(starts >= lo) & (starts < lo + width)] - lo
        seqs.append(PackedSequence(tokens=tokens[i], run_id="holdout", doc_starts=inside.astype("<u4"),
                                   valid=None if total >= lo + width else total - lo))
    return seqs, starts, total


def document_losses(model: Any, held: HeldOut, batch_size: int = 8) -> np.ndarray:
    """Per document of ``held`` (in order): its loss in nats."""
    import torch
    import torch.nn.functional as F

    from training.data.batch import IGNORE, make_batch

    device = next(model.parameters()).device
    out: list[np.ndarray] = []
    for part in held.parts:
        seqs, starts, total = part_windows(part)
        width = part["tokens"].shape[1]
        loss = np.zeros(len(starts), dtype=np.float64)
        for b in range(0, len(seqs), batch_size):
            batch = make_batch(seqs[b:b + batch_size], [], width - 1)
            with torch.no_grad():
                logits = model(input_ids=torch.from_numpy(batch.input_ids).to(device),
                               position_ids=torch.from_numpy(batch.position_ids).to(device), use_cache=False).logits
                labels = torch.from_numpy(batch.labels).to(device)
                per = F.cross_entropy(logits.float().transpose(1, 2), labels, ignore_index=IGNORE, reduction="none")
            rows = np.arange(b, b + len(batch.labels))[:, None] * width
            label_at = rows + np.arange(1, width)[None, :]  # the label's place in the flattened stream
            keep = (batch.labels != IGNORE) & (label_at < total) & ~np.isin(label_at, starts)
            np.add.at(loss, np.searchsorted(starts, label_at[keep], side="right") - 1, per.cpu().numpy()[keep])
        out.append(loss)
    return np.concatenate(out) if out else np.zeros(0)


def ratio(num: np.ndarray, den: np.ndarray) -> tuple[float, float]:
    """Σnum/Σden and its standard error over documents (the delta method for a ratio estimator)."""
    total = float(den.sum())
    if len(num) == 0 or total == 0:
        return float("nan"), float("nan")
    r = float(num.sum()) / total
    if len(num) < 2:
        return r, float("nan")
    resid = num - r * den
    return r, math.sqrt(float((resid ** 2).sum()) * len(num) / (len(num) - 1)) / total


def figures(held: HeldOut, loss: np.ndarray, baseline: np.ndarray | None = None) -> dict[str, Any]:
    """Bits per byte (and standard error) of the set and of each source; with a baseline, its figures on the
    same documents and the paired difference (candidate - baseline: positive = the candidate is worse)."""
    def one(mask: np.ndarray) -> dict[str, Any]:
        nbytes = held.doc_bytes[mask].astype(np.float64)
        bpb, se = ratio(loss[mask] / LN2, nbytes)
        row: dict[str, Any] = {"docs": int(mask.sum()), "bytes": int(nbytes.sum()), "bpb": bpb, "stderr": se}
        if baseline is not None:
            row["baseline_bpb"], row["baseline_stderr"] = ratio(baseline[mask] / LN2, nbytes)
            row["delta"], row["delta_stderr"] = ratio((loss[mask] - baseline[mask]) / LN2, nbytes)
        return row

    sources = np.asarray(held.sources)
    return {"all": one(np.ones(len(loss), dtype=bool)),
            "sources": {s: one(sources == s) for s in sorted(set(held.sources))}}


def load_model(folder: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    model.config.use_cache = False
    return model.to(torch.device("cuda" if torch.cuda.is_available() else "cpu")).eval()


def evaluate(model_dir: str, sets: dict[str, Path], baseline_dir: str | None = None,
             batch_size: int = 8) -> dict[str, Any]:
    """Every set scored by the model (and the baseline): the figures per set."""
    t0 = time.monotonic()
    held = {name: HeldOut.load(folder) for name, folder in sets.items()}
    candidate = load_model(model_dir)
    losses = {name: document_losses(candidate, h, batch_size) for name, h in held.items()}
    del candidate
    base: dict[str, Any] = {name: None for name in held}
    if baseline_dir:
        reference = load_model(baseline_dir)
        base = {name: document_losses(reference, h, batch_size) for name, h in held.items()}
    return {"model": model_dir, "baseline": baseline_dir, "seconds": round(time.monotonic() - t0, 3),
            "sets": {name: {"path": str(sets[name]), **figures(h, losses[name], base[name])}
                     for name, h in held.items()}}


def evaluate_night(manifest_path: str | Path, plan_path: str | Path, folder: str | Path,
                   mix_plan: str | Path | None = None) -> dict[str, Any] | None:
    """In the trainer's process, right after its export (rank 0): the night's sets (stoker.lines.eval_sets.eval_sets,
    and a mixture night's components' ``mixture_sets``) scored by the exported model and by the model it continued,
    into the trainer's ``eval.json``; the evaluate task takes them instead of starting a process that imports torch
    again. None when the night has no set with a document (``eval.ungated`` decides it)."""
    from stoker.files import atomic_write_json
    from stoker.layout import RunLayout, TrainerFiles
    from stoker.lines.eval_sets import baseline_model, eval_sets, mixture_sets
    from stoker.run.manifest import read_manifest
    from stoker.run.plan import read_plan

    m, run, files = read_manifest(manifest_path), RunLayout.of_manifest(manifest_path), TrainerFiles(Path(folder))
    count = read_plan(plan_path).corpus.eval.forgetting_nights
    if not files.parent.is_file():
        return None
    parent = json.loads(files.parent.read_text())
    sets = eval_sets(run.holdout, parent, m.ds, m.corpus, count) | mixture_sets(mix_plan, m.corpus)
    if not sets:
        return None
    baseline = baseline_model(parent)
    result = evaluate(str(files.export), sets, str(baseline) if baseline else None)
    atomic_write_json(files.evaluation, result)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the candidate: a Hugging Face folder")
    ap.add_argument("--baseline", help="scored on the same documents (e.g. the line's blessed model)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=DIR", help="a held-out folder, named")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--batch-size", type=int, default=8)
    args = ap.parse_args(argv)
    sets = dict(s.split("=", 1) for s in args.set)
    if not sets:
        ap.error("give at least one --set NAME=HOLDOUT_DIR")
    from stoker.files import atomic_write_json

    result = evaluate(args.model, {k: Path(v) for k, v in sets.items()}, args.baseline, args.batch_size)
    atomic_write_json(args.out, result)
    print(json.dumps({k: v["all"] for k, v in result["sets"].items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
