"""What the state folder holds, for people: every run folder (failed and unfinished ones too) with its
state and why, and the nights of a model line. Read from the files the stages write; no service asked.
``stoker runs list`` and ``stoker lines show`` print these."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stoker import paths
from stoker.layout import LineLayout, RunLayout
from stoker.run.manifest import read_manifest


def _json(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def _unfinished(run: RunLayout) -> tuple[str, str]:
    """A run folder without a manifest: the stage it stopped in (or is still in)."""
    timings = _json(run.timings)
    started = [(v.get("start", 0), k) for k, v in timings.items() if isinstance(v, dict) and "start" in v]
    if not started:
        return "not published", "no stage recorded (the run never got past await_source)"
    _, last = max(started)
    ended = "end" in timings[last]
    why = f"{last} ended, the next stage never started" if ended else f"{last} started and never ended (it failed, " \
        "or still runs: see Airflow or the run's logs/)"
    return "not published", why


def run_state(run_dir: Path) -> dict[str, Any]:
    """One run folder's state: ``published``/``trained``/``joined``/``skipped``/``failed``/``not published``,
    why, and its counts."""
    from stoker.reports.runs import training_skipped

    run = RunLayout(Path(run_dir))
    row: dict[str, Any] = {"run": f"{run.run_dir.parent.name}/{run.run_dir.name}", "run_dir": str(run.run_dir),
                           "sequences": None, "steps": None, "line": None}
    if not run.manifest.is_file():
        row["state"], row["why"] = _unfinished(run)
        return row
    m = read_manifest(run.run_dir)
    files = run.trainer(m.topic)
    row["sequences"], row["topic"] = m.sequences, m.topic
    failure, summary, parent = _json(files.failure), _json(files.summary), _json(files.parent)
    row["line"] = parent.get("line")
    skipped = training_skipped(m)
    if skipped:
        row["state"], row["why"] = "skipped", skipped
    elif failure:
        row["state"], row["why"] = "failed", str(failure.get("message", failure))
    elif summary:
        row["steps"] = summary.get("steps")
        night = LineLayout.of(parent["line"]).night(m.ds, m.corpus) if parent else None
        joined = night is not None and _json(night.record).get("topic") == m.topic
        row["state"] = "joined" if joined else "trained"
        row["why"] = f"night of line {parent['line']}" if joined else "trained; not (yet) joined to a line"
    elif files.rc.is_file() and files.rc.read_text().strip() not in ("", "0"):
        row["state"], row["why"] = "failed", f"trainer exited {files.rc.read_text().strip()} (log: {files.log})"
    else:
        row["state"], row["why"] = "published", "published; training not finished (or still running)"
    return row


def list_runs(root: Path | None = None) -> list[dict[str, Any]]:
    """Every run folder under ``.stoker/runs`` (corpus/date), by corpus then date."""
    base = Path(root) if root is not None else paths.runs_dir()
    folders = sorted(p for p in base.glob("*/*") if p.is_dir() and p.name[:4].isdigit())
    return [run_state(p) for p in folders]


def render_runs(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return f"no runs under {paths.runs_dir()}: `make run` makes one"
    out = [f"{'run':<32}{'state':<15}{'sequences':>10}{'steps':>7}  why"]
    for r in rows:
        seqs = "-" if r["sequences"] is None else str(r["sequences"])
        steps = "-" if r["steps"] is None else str(r["steps"])
        out.append(f"{r['run']:<32}{r['state']:<15}{seqs:>10}{steps:>7}  {r['why']}")
    return "\n".join(out)


def line_nights(line: str) -> list[dict[str, Any]]:
    """The nights of a model line in join order, each with its parent, role, steps and losses."""
    from stoker.lines.ledger import decision_of, head, state
    from stoker.lines.nights import joined_nights, same_night

    layout = LineLayout.of(line)
    top = head(layout)
    rows = []
    for rec, night in joined_nights(layout):
        p = rec.get("parent", {})
        parent = (f"{p.get('ds')}.{p.get('corpus')}" if p.get("kind") == "night"
                  else p.get("path") or p.get("kind", "random"))
        rows.append({"night": night.folder.name, "seq": rec.get("seq"), "role": p.get("role", "head"),
                     "parent": parent, "topic": rec.get("topic"), "steps": rec.get("steps"),
                     "first_loss": rec.get("first_loss"), "last_loss": rec.get("last_loss"),
                     "head": same_night(rec, top), "decision": state(rec),
                     "decided_by": (decision_of(rec) or {}).get("by"),
                     "bpb": (rec.get("eval") or {}).get("night", {}).get("bpb"),
                     "folder": str(night.folder)})
    return rows


def render_line(line: str, rows: list[dict[str, Any]]) -> str:
    folder = LineLayout.of(line).folder
    if not rows:
        return f"line {line}: no night has joined it yet ({folder})"
    out = [f"line {line}  ({folder}); * marks the head, the night the next one continues; bits/byte: on the "
           "night's own held-out documents (lower is better)",
           f"  {'night':<26}{'role':<8}{'steps':>7}{'loss':>17}  {'decision':<20}{'bits/byte':>10}  parent"]
    scores = [r["bpb"] for r in rows if isinstance(r.get("bpb"), float | int)]
    for r in rows:
        loss = (f"{r['first_loss']:.3f} -> {r['last_loss']:.3f}" if r["first_loss"] is not None
                and r["last_loss"] is not None else "-")
        mark = "*" if r["head"] else " "
        by = r.get("decided_by") or "gate"
        decision = (r.get("decision") or "-") + ("" if by in ("gate", "ledger", "an earlier Stoker") else
                                                 " (rule)" if by == "rule" else " (by hand)")
        bpb = f"{r['bpb']:.4f}" if isinstance(r.get("bpb"), float | int) else "-"
        out.append(f"{mark} {r['night']:<26}{r['role']:<8}{str(r['steps'] or '-'):>7}{loss:>17}  {decision:<20}"
                   f"{bpb:>10} {_bar(r.get('bpb'), scores)} {r['parent']}")
    return "\n".join(out)


def _bar(value: Any, scores: list[float], width: int = 12) -> str:
    """The night's figure as a bar between the line's lowest and highest: the line's nights as a plot."""
    if not isinstance(value, float | int) or not scores:
        return " " * width
    lo, hi = min(scores), max(scores)
    n = 1 + round((value - lo) / (hi - lo) * (width - 1)) if hi > lo else 1
    return ("#" * n).ljust(width)
