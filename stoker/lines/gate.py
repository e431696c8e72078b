"""The promotion gate: whether a night that continued the line's head may become its head.

The evaluate task scores the night's model and the head it continued (the line's blessed model) on the same
held-out documents: the night's own and each earlier night's (training/evaluate.py). Each figure's change is
``candidate - blessed`` in bits per byte with the standard error of that paired difference. A figure
*regresses* when its change exceeds ``max(eval.gate_k x stderr, floor)``, or is not a number (a diverged
model); the floor is ``eval.max_regression`` on the night's own set, ``eval.max_forgetting`` on earlier nights'.
No regression: ``promoted``. Otherwise ``held``: the night stays in the line's history with its figures and is
never continued (:func:`stoker.lines.ledger.blessed`); the next night continues the head.

A night with nothing to compare against (the line's first night from random weights) is promoted; a branch
(a night the head could not take) is never the head and is not gated.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from stoker.config.eval import Review, Ungated
from stoker.exceptions import StokerError
from stoker.layout import LineLayout
from stoker.lines import ledger
from stoker.lines.lease import LeaseHolder, lease_file, lease_holder
from stoker.lines.nights import Decision, Role, read_night, same_night

CHOICES = {Review.PROMOTE: Decision.PROMOTED, Review.HOLD: Decision.HELD, Review.ROLL_BACK: Decision.ROLLED_BACK}
"""What a person may decide on a gated night (`stoker lines decide`, `stoker refresh --decision`)."""
REVIEW_OPTIONS = {"Promote": Review.PROMOTE, "Hold": Review.HOLD, "Roll back": Review.ROLL_BACK}
"""The review step's options as a person sees them in Airflow (``training.review``), and the choice each makes."""
REVIEW_TASK = "training.review"
FORGETTING = "forgetting:"
"""The name prefix of an earlier night's set in an evaluation (training/evaluate.py)."""


def regressions(result: dict[str, Any], k: float, max_regression: float,
                max_forgetting: float | None = None) -> list[dict[str, Any]]:
    """The figures of an evaluation (``eval.json``) that regress against its baseline; ``max_forgetting`` (default
    ``max_regression``) is the floor of the earlier nights' sets."""
    out = []
    for name, figures in sorted(result.get("sets", {}).items()):
        a = figures["all"]
        if "delta" not in a:
            continue
        se = a.get("delta_stderr")
        floor = max_forgetting if max_forgetting is not None and name.startswith(FORGETTING) else max_regression
        bar = max(k * se if se is not None and math.isfinite(se) else 0.0, floor)
        delta = a["delta"]
        if not (isinstance(delta, float | int) and math.isfinite(delta)) or delta > bar:
            out.append({"set": name, "bpb": a["bpb"], "blessed_bpb": a["baseline_bpb"], "change": delta,
                        "stderr": se, "allowed": bar})
    return out


def decide(result: dict[str, Any], role: str, k: float, max_regression: float,
           max_forgetting: float | None = None) -> dict[str, Any]:
    """The gate's decision on an evaluation of a night whose role (chosen at its launch) is ``role``."""
    at = datetime.now(UTC).isoformat(timespec="seconds")
    if role != Role.HEAD:
        return {"decision": Decision.BRANCH, "by": "gate", "at": at, "why": "a branch never becomes the head"}
    if not result.get("baseline"):
        return {"decision": Decision.PROMOTED, "by": "gate", "at": at,
                "why": "no blessed model to compare with (the line's first night)"}
    bad = regressions(result, k, max_regression, max_forgetting)
    rule = f"no figure worse by more than max({k:g} x stderr, {max_regression:g}) bits per byte" + (
        f" ({max_forgetting:g} on earlier nights' sets)" if max_forgetting is not None else "")
    if bad:
        worst = max(bad, key=lambda r: r["change"] if math.isfinite(r["change"]) else math.inf)
        return {"decision": Decision.HELD, "by": "gate", "at": at, "rule": rule, "regressions": bad,
                "why": f"{worst['set']}: {worst['bpb']:.4f} bits/byte vs the blessed {worst['blessed_bpb']:.4f} "
                       f"(change {worst['change']:+.4f}, allowed {worst['allowed']:.4f})"}
    return {"decision": Decision.PROMOTED, "by": "gate", "at": at, "rule": rule, "why": "no figure regressed"}


def eval_table(result: dict[str, Any], decision: dict[str, Any]) -> str:
    """The model card's evaluation section: each figure, the blessed model's, the decision and who made it."""
    lines = ["## Evaluation on held-out documents (bits per byte, lower is better)", "",
             "| set | documents | this night | blessed | change |", "|---|---|---|---|---|"]
    for name, figures in result.get("sets", {}).items():
        a = figures["all"]
        was = f"{a['baseline_bpb']:.4f} ± {a['baseline_stderr']:.4f}" if "baseline_bpb" in a else "-"
        change = f"{a['delta']:+.4f} ± {a['delta_stderr']:.4f}" if "delta" in a else "-"
        lines.append(f"| {name} | {a['docs']} | {a['bpb']:.4f} ± {a['stderr']:.4f} | {was} | {change} |")
    lines += ["", f"Decision: **{decision['decision']}** by {decision['by']} on {decision['at']}: {decision['why']}.",
              ""]
    if result.get("lm_eval"):
        lines += ["## lm-evaluation-harness tasks (they inform; the gate reads bits per byte)", "",
                  "| task | metric | documents | this night | blessed |", "|---|---|---|---|---|"]
        lines += [f"| {task} | {name} | {docs} | {now} | {was} |" for task, name, docs, now, was in
                  lm_eval_rows(result["lm_eval"])]
        lines.append("")
    return "\n".join(lines)


def lm_eval_rows(lm: dict[str, Any]) -> list[tuple[str, str, int, str, str]]:
    """``eval.lm_eval_tasks``' figures (training/lm_eval_tasks.py) as rows: task, metric, documents, this
    night's value ± stderr, the blessed model's (or "-")."""
    def shown(value: float, stderr: float | None) -> str:
        return f"{value:.4f}" + (f" ± {stderr:.4f}" if stderr is not None else "")

    return [(task, name, row["docs"], shown(m["value"], m["stderr"]),
             shown(m["baseline"], m.get("baseline_stderr")) if "baseline" in m else "-")
            for task, row in lm.get("tasks", {}).items() for name, m in row["metrics"].items()]


def record_decision(line: LineLayout, ds: str, corpus: str, result: dict[str, Any],
                    decision: dict[str, Any]) -> dict[str, Any]:
    """The decision into the night's record through the line's ledger (``stoker.lines.ledger.decide``: a person's
    decision is never overwritten by the gate's) and into its model card; returns the decision in effect."""
    decision = ledger.decide(line, ds, corpus, decision, result)
    night = line.night(ds, corpus)
    card = night.card.read_text() if night.card.is_file() else ""
    card = card.split("## Evaluation on held-out documents", 1)[0].rstrip("\n") + "\n\n"
    night.card.unlink(missing_ok=True)  # a new file: the card may be a hard link into the run's export
    night.card.write_text(card + eval_table(result, decision))
    return decision


def ungated(rule: str, why: str) -> dict[str, Any]:
    """The decision on a night with no held-out document to score (``eval.ungated``: ``promote`` or ``hold``),
    recorded as the rule's, with why."""
    return {"decision": Decision.PROMOTED if rule == Ungated.PROMOTE else Decision.HELD, "by": "rule",
            "at": datetime.now(UTC).isoformat(timespec="seconds"), "rule": f"eval.ungated: {rule}",
            "why": f"{why}; eval.ungated: {rule}"}


def human_decision(line: LineLayout, ds: str, corpus: str, choice: str, who: str, why: str = "",
                   run: LeaseHolder | None = None) -> dict[str, Any]:
    """A person's decision on a night of ``line``, pending or gated: ``promote`` it (it becomes the head: no night
    may have continued the line since, and it holds no rolled-back night), ``hold`` it (confirm the gate, or keep
    a pending night from the line), ``roll-back`` a held or pending night or the promoted head (the head returns
    to the promoted night before it). Recorded with who and when, the earlier decision kept as ``previous``; the
    model card's table says it. Refused, with why, otherwise (a branch, a night passed over), and while another
    night holds the line's training lease (``run``: the DAG run asking, whose own lease does not count): a decision
    then races that night, which would join as a branch or continue a night rolled back under it."""
    if choice not in CHOICES:
        raise StokerError(f"decision {choice!r}: choose one of {', '.join(CHOICES)}")
    holder = lease_holder(line)
    if holder is not None and not (run is not None and holder.same_run(run)):
        raise StokerError(f"line {line.name} is busy: {holder.describe()} holds its training lease "
                          f"({holder.task_id}); decide once that night has joined the line and been decided "
                          f"(`stoker lines show {line.name}`). If its run is gone without Airflow knowing, remove "
                          f"{lease_file(line)}")
    night = line.night(ds, corpus)
    if not night.record.is_file():
        raise StokerError(f"line {line.name} has no night {ds}.{corpus}: `stoker lines show {line.name}` lists them")
    record = read_night(night)
    now = ledger.state(record)
    if now in (Decision.BRANCH, Decision.PASSED_OVER):
        raise StokerError(f"night {ds}.{corpus} of line {line.name} is {now}: "
                          + ("a branch never becomes the head" if now == Decision.BRANCH else
                             "a later night continued the line before it was decided; its data is in no model of "
                             "the head (re-run the night to train it again)"))
    if choice == Review.ROLL_BACK and now == Decision.PROMOTED and not same_night(ledger.head(line), record):
        raise StokerError(f"night {ds}.{corpus} is not line {line.name}'s head (a later night continued it): roll "
                          "back the head first")
    if choice == Review.HOLD and now not in (Decision.HELD, ledger.PENDING):
        raise StokerError(f"night {ds}.{corpus} is {now}, not held: `roll-back` takes a promoted head back")
    decision = {"decision": CHOICES[Review(choice)], "by": who, "at": datetime.now(UTC).isoformat(timespec="seconds"),
                "why": why or f"{choice} by {who}"}
    result = {"sets": {name: {"all": figures} for name, figures in record.get("eval", {}).items()},
              "lm_eval": record.get("lm_eval")}
    try:
        return record_decision(line, ds, corpus, result, decision)
    except ledger.LedgerError as e:
        raise StokerError(f"{choice} refused: {e}") from None
