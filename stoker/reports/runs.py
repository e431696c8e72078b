"""Run summaries: what a refresh did, from its manifest and its stage timings."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from stoker import paths
from stoker.exceptions import ManifestError
from stoker.files import atomic_write_json
from stoker.layout import LineLayout, RunLayout
from stoker.layout import all_runs as _all_run_layouts
from stoker.lines.gate import lm_eval_rows
from stoker.lines.ledger import state as ledger_state
from stoker.run.manifest import read_manifest
from stoker.run.reasons import by_step, drop_rate_alarm


def record_stage(run_dir: Path, stage: str, event: str, now: float | None = None, run: str = "") -> None:
    """Note a stage's first start or last end. Retries and deferrals of one Airflow run keep the
    first start; another run of the same date (``run`` differs) starts the stage afresh."""
    path = RunLayout(Path(run_dir)).timings
    data = _read_json(path)
    row = data.setdefault(stage, {})
    if row.get("run") != run:
        row = data[stage] = {"run": run}
    now = time.time() if now is None else now
    if event == "start":
        row.setdefault("start", now)
    else:
        row["end"] = now
    atomic_write_json(path, data)


def stage_rows(run_dir: Path) -> list[dict[str, Any]]:
    """Each stage's first start, last end and seconds, in the order they started."""
    data = _read_json(RunLayout(Path(run_dir)).timings)
    rows = [{"stage": k, "start": v.get("start"), "end": v.get("end"),
             "seconds": round(v["end"] - v["start"], 1) if "start" in v and "end" in v else None}
            for k, v in data.items() if isinstance(v, dict)]
    return sorted(rows, key=lambda r: r["start"] or 0)


def stage_seconds(run_dir: Path) -> dict[str, float]:
    data = _read_json(RunLayout(Path(run_dir)).timings)
    return {k: round(v["end"] - v["start"], 1) for k, v in data.items() if "start" in v and "end" in v}


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def all_runs() -> list[Path]:
    """Run folders with a manifest, oldest manifest first."""
    found = [r for r in _all_run_layouts()]
    return [r.run_dir for r in sorted(found, key=lambda r: r.manifest.stat().st_mtime)]


def find_run(ref: str | None) -> Path:
    """``ref`` is a run folder, ``<corpus>/<ds>``, or None for the latest run."""
    if ref is None:
        runs = all_runs()
        if not runs:
            raise ManifestError(f"no runs under {paths.runs_dir()}: run `make run` first")
        return runs[-1]
    p = Path(ref)
    candidate = p if p.is_dir() else paths.runs_dir() / ref
    if RunLayout(candidate).manifest.is_file() or (candidate.is_dir() and candidate.name[:4].isdigit()):
        return candidate
    if candidate.is_dir():  # a corpus: its latest published run
        mine = [r for r in all_runs() if r.parent == candidate]
        if mine:
            return mine[-1]
        raise ManifestError(f"corpus {candidate.name!r} has no published run in {candidate} "
                            "(`stoker runs list` shows the unfinished ones and why)")
    raise ManifestError(f"run {ref!r} not found (looked in {candidate}): use <corpus>, <corpus>/<YYYY-MM-DD> or a "
                        "run folder; `stoker runs list` lists them")


def training_skipped(m: Any) -> str | None:
    """Why a run has nothing to train on (a night whose drop holds no usable document), else None."""
    if m.sequences > 0:
        return None
    why = ", ".join(f"{v} {k}" for k, v in m.docs_dropped.items()) or "no records at all"
    return (f"no usable document in {m.source_uri}: {m.docs_in} records read, {m.docs_kept} kept ({why}); "
            f"training skipped. The rejected records are in {m.quarantine_path}")


def summary(run_dir: Path) -> dict[str, Any]:
    m = read_manifest(run_dir)
    return {
        "run_id": m.run_id, "run_dir": str(run_dir), "topic": m.topic,
        "docs_in": m.docs_in, "docs_kept": m.docs_kept, "docs_dropped": m.docs_dropped,
        "dropped_by_step": by_step(m.docs_dropped),
        "drop_rate": drop_rate_alarm(m.docs_dropped, m.docs_in, _earlier_nights(Path(run_dir), m.ds)),
        "tokens": m.tokens, "padding_tokens": m.padding_tokens, "sequences": m.sequences,
        "seq_len": m.seq_len, "dtype": m.dtype,
        "partitions": [{"partition": p.partition, "sequences": p.sequences,
                        "offsets": [p.start_offset, p.end_offset]} for p in m.partitions],
        "tokenizer_sha256": m.tokenizer_sha256, "tokenizer_backend": m.tokenizer_backend, "source_uri": m.source_uri,
        "source_files": len(m.source_files), "source_bytes": sum(f.get("bytes", 0) for f in m.source_files),
        "sources": [{k: f.get(k) for k in ("path", "bytes", "docs_in", "docs_kept", "docs_dropped", "tokens")}
                    for f in m.source_files],
        "quarantine": m.quarantine_path, "spark_app_id": m.spark_app_id,
        "stage_seconds": stage_seconds(run_dir),
        "stages": stage_rows(run_dir),
        "training": _training(run_dir, m),
        "training_skipped": training_skipped(m),
        "params": (_read_json(RunLayout(Path(run_dir)).plan) or {}).get("params"),
        "holdout": m.holdout or None,
        "scrubbed": m.scrubbed or None,
        "eval": _read_json(RunLayout(Path(run_dir)).evaluation),
    }


def _alarm(rate: dict[str, Any]) -> str:
    return f"  ** drop rate jumped: {rate['why']} **" if rate.get("flagged") else ""


def _earlier_nights(run_dir: Path, ds: str) -> list[tuple[dict[str, int], int]]:
    """The drops by reason and records read of the corpus's nights before ``ds`` (sibling run folders), oldest first."""
    out = []
    for folder in sorted(p for p in run_dir.parent.iterdir() if p.name < ds and RunLayout(p).manifest.is_file()):
        try:
            earlier = read_manifest(folder)
        except ManifestError:
            continue
        out.append((earlier.docs_dropped, earlier.docs_in))
    return out


def _training(run_dir: Path, m: Any) -> dict[str, Any] | None:
    """The trainer's summary for the manifest's topic, if it has finished."""
    files = RunLayout(Path(run_dir)).trainer(m.topic)
    data = _read_json(files.summary)
    if not data:
        return None
    keys = ("steps", "sequences_consumed", "sequences_published", "tokens_consumed", "first_loss", "last_loss",
            "checkpoint", "export", "loss_curve", "data_wait_fraction", "world_size", "recipe", "ranks",
            "sequences_replayed", "mixture")
    return {**{k: data.get(k) for k in keys}, "line": _line(files, m), "replay": _read_json(files.replay_draw) or None}


def _line(files: Any, m: Any) -> dict[str, Any] | None:
    """The model line the night continued, its parent, and whether the night joined the line."""
    parent = _read_json(files.parent)
    if not parent:
        return None
    night = LineLayout.of(parent["line"]).night(m.ds, m.corpus)
    record = _read_json(night.record) or {}
    joined = record.get("topic") == m.topic
    return {"line": parent["line"], "parent": parent, "joined": joined,
            "card": str(night.card) if joined else None,
            "decision": ledger_state(record) if joined else None}


def render(s: dict[str, Any]) -> str:
    dropped = s["docs_dropped"]
    lines = [
        f"run {s['run_id']}  ({s['run_dir']})",
        f"  topic            {s['topic']}",
        *(["  params           " + "  ".join(f"{k}={v}" for k, v in s["params"].items())] if s.get("params") else []),
        f"  source           {s['source_uri']}  ({s['source_files']} files, {s['source_bytes']} bytes)",
        f"  docs in          {s['docs_in']}",
        f"  docs kept        {s['docs_kept']}",
        f"  docs dropped     {sum(dropped.values())}" + _alarm(s.get("drop_rate") or {})
        + "".join(f"\n    {step:<18}{k:<29}{v}" for step, reasons in by_step(dropped).items()
                  for k, v in reasons.items()),
        *([f"  docs scrubbed    {s['scrubbed']['docs']}  ({s['scrubbed']['addresses']} e-mail or IP addresses "
             "replaced)"] if s.get("scrubbed") else []),
        f"  tokens           {s['tokens']}  (+{s['padding_tokens']} padding)",
        f"  sequences        {s['sequences']}  (seq_len {s['seq_len']} + 1, {s['dtype']})",
        "  partitions       " + "  ".join(
            f"p{p['partition']}: {p['sequences']} seq @ [{p['offsets'][0]}, {p['offsets'][1]})"
            for p in s["partitions"]),
        *_render_sources(s.get("sources") or []),
        f"  tokenizer sha256 {s['tokenizer_sha256']}",
        *([f"  tokenizer        {b['name']} {b.get('version', '')}: {b.get('reason', '')}"
           + (f"; {b['checked_in_tasks']} documents checked again in the tasks" if b.get("checked_in_tasks") else "")]
          if (b := s.get("tokenizer_backend")) else []),
        f"  quarantine       {s['quarantine']}",
        "  seconds          " + ("  ".join(f"{r['stage']} {r['seconds']}" for r in s.get("stages") or []
                                        if r["seconds"] is not None) or "-"),
    ]
    t = s.get("training")
    if s.get("training_skipped"):
        lines.append(f"  training         skipped: {s['training_skipped']}")
    if t:
        lines += [
            f"  training         {t['recipe']}, {t['world_size']} rank(s), {t['steps']} steps",
            f"    consumed       {t['sequences_consumed']} of {t['sequences_published']} sequences "
            f"({t['tokens_consumed']} label tokens)",
            *([f"    replayed       {t['sequences_replayed']} sequences of {len(t['replay']['nights'])} earlier "
               f"night(s) (train.replay {t['replay']['share']}; {t['replay']['drawn'] - t['replay']['replayed']} "
               "drawn were gone)"] if t.get("replay") else []),
            *_render_mixture(t.get("mixture")),
            f"    loss           {t['first_loss']:.3f} -> {t['last_loss']:.3f}",
            f"    data wait      {100 * t['data_wait_fraction']:.2f}% of step time",
            *(f"    rank {r['rank']:<9} partitions {r['partitions']}: {r['tokens_this_session']} label tokens"
              for r in t.get("ranks") or []),
            f"    checkpoint     {t['checkpoint']}",
            f"    export         {t['export']}",
            f"    loss curve     {t['loss_curve']}",
            *_render_line(t.get("line")),
        ]
    return "\n".join([*lines, *_render_eval(s.get("holdout"), s.get("eval"))])


def _render_mixture(mix: dict[str, Any] | None) -> list[str]:
    """A mixture night's realised token shares beside its targets, its rows beside what each corpus published, and
    the widest gap over its windows of steps (training/data/mixture_source.py)."""
    if not mix:
        return []
    real, targets = mix["realised"], mix["targets"]
    gaps = [(abs(w["token_shares"].get(k, 0.0) - share), w["steps"], k)
            for w in mix["windows"] for k, share in targets.items()]
    gap, steps, worst = max(gaps, default=(0.0, [0, 0], "-"))
    rows = "  ".join(f"{k} {n} of {mix['available'][k]}" + (f" (+{mix['repeated'][k]} repeated)"
                                                            if mix["repeated"].get(k) else "")
                     + (f" ({mix['left'][k]} left in its topic)" if mix["left"].get(k) else "")
                     for k, n in real["rows"].items())
    return [
        "    mixture        " + "  ".join(f"{k} {real['token_shares'].get(k, 0.0):.4f} (target {s:.4f})"
                                          for k, s in targets.items())
        + f" of label tokens; when_short {mix['when_short']}{', stratified' if mix['stratified'] else ''}",
        f"    mixed rows     {rows}",
        f"    per {mix['window_steps']} steps  widest gap {100 * gap:.2f} pp ({worst}, steps {steps[0]}-{steps[1]})",
        *(f"    left out       {k}: {why}" for k, why in (mix.get("missing") or {}).items()),
    ]


def _render_eval(holdout: dict[str, Any] | None, ev: dict[str, Any] | None) -> list[str]:
    """What was held out, and the night's figures on it (training/evaluate.py)."""
    if not holdout:
        return []
    out = [f"  held out         {holdout['docs']} docs ({holdout['per_mille']} per mille), {holdout['bytes']} bytes, "
           f"{holdout['sequences']} sequences"]
    for name, f in ((ev or {}).get("sets") or {}).items():
        a = f["all"]
        vs = (f"; was {a['baseline_bpb']:.4f}, change {a['delta']:+.4f} ± {a['delta_stderr']:.4f}"
              if "delta" in a else "")
        out.append(f"    {name:<14} {a['bpb']:.4f} bits/byte ± {a['stderr']:.4f} ({a['docs']} docs){vs}")
    for task, name, docs, now, was in lm_eval_rows((ev or {}).get("lm_eval") or {}):
        out.append(f"    {task + ' ' + name:<14} {now} ({docs} docs){'; was ' + was if was != '-' else ''}")
    decision = (ev or {}).get("decision")
    if decision:
        out.append(f"  decision         {decision['decision']} by {decision['by']}: {decision['why']}")
    return out


def _render_line(line: dict[str, Any] | None) -> list[str]:
    if not line:
        return []
    p = line["parent"]
    of = f" of {p['corpus']}" if p.get("corpus") else ""
    start = f"night {p['ds']}{of}" if p["kind"] == "night" else p.get("path") or "random weights"
    role = "" if p.get("role", "head") == "head" else " (a branch: the head does not take it)"
    if line.get("decision") in ("held", "rolled_back"):
        role = f" ({line['decision']}: in its history, not its head; the next night continues the head)"
    elif line.get("decision") == "pending":
        role = " (pending: not the head until decided; `stoker lines decide` decides it)"
    elif line.get("decision") == "passed_over":
        role = (" (passed over: undecided when a later night continued the line; its data is in no model of the "
                "head)")
    state = f"joined{role}; model card {line['card']}" if line["joined"] else "not joined (training did not finish)"
    return [f"  model line       {line['line']}: continued {start}; {state}"]


def _render_sources(sources: list[dict[str, Any]], most: int = 8) -> list[str]:
    """The realised mixture: per source file, documents in and kept, tokens (the largest first)."""
    rows = [f for f in sources if f.get("docs_in") is not None]
    if not rows:
        return []
    top = sorted(rows, key=lambda f: -(f.get("tokens") or 0))[:most]
    out = [f"  sources          {'docs in':>9} {'kept':>9} {'tokens':>11}  file"]
    pad = " " * 19
    out += [f"{pad}{f['docs_in']:>9} {f['docs_kept']:>9} {f['tokens']:>11}  {f['path'].rsplit('/', 1)[-1]}"
            for f in top]
    if len(rows) > most:
        out.append(f"{pad}... {len(rows) - most} more files (stoker runs show --json)")
    return out


def render_stages(s: dict[str, Any]) -> str:
    """The run's stages as a table: when each started (UTC), how long it took."""
    lines = [f"run {s['run_id']}  ({s['run_dir']})", f"  {'stage':<18}{'started (UTC)':<22}{'seconds':>9}"]
    for r in s.get("stages") or []:
        start = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r["start"])) if r["start"] else "-"
        secs = f"{r['seconds']:.1f}" if r["seconds"] is not None else "running"
        lines.append(f"  {r['stage']:<18}{start:<22}{secs:>9}")
    return "\n".join(lines)
