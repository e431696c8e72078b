"""A model line's ledger: the one writer of its nights' records (``nights/<ds>.<corpus>/night.json``).

Every change of a night's state goes through here, and each is checked against the line's invariants at the
write (:func:`check`):

* **Joined nights are pending.** A night that finished training joins the line *pending* (no decision): it is
  never a parent and never the head until it is decided. A branch (a night the head could not take) is decided
  ``branch`` as it joins: it is never gated and never the head.
* **Decided.** The gate (``by: gate``), the corpus's rule for nights with no held-out document (``by: rule``,
  ``eval.ungated``) or a named person decides a pending night: ``promoted``, ``held`` or ``rolled_back``. A
  person's decision is never replaced by the gate's or the rule's (a cleared evaluate task): their figures are
  recorded, the person's decision stands; a person's new decision keeps the one before it as ``previous``.
* **Passed over.** A pending night that a later night continued the line past (its evaluate failed for good, so
  the lease went to the next night, which continued the last promoted night) is ``passed_over``: final, listed,
  never the head. Its data is in no model of the line's head; `stoker lines show` says so.
* **The head** is the night that joined last as the line's continuation and was promoted. Its lineage holds no
  rolled-back night: nothing a rolled-back night taught comes back as head.

A record of an earlier Stoker (no ``version``) that has no decision was joined under the old rule (a joined night
was continuable): it reads as promoted, ``by: an earlier Stoker``, so an existing line keeps its head. A record of
a newer Stoker is refused.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from stoker.exceptions import StokerError
from stoker.files import atomic_write_json
from stoker.layout import LineLayout, NightFiles
from stoker.lines.nights import Decision, Night, Role, joined_nights, read_night

RECORD_VERSION = 2
"""The night record's format: 2 adds ``version`` and the pending state (no decision until decided)."""
PENDING = "pending"
"""The state of a joined night with no decision yet."""
AUTOMATIC = ("gate", "rule", "ledger")
"""Who decides without a person: the gate, the corpus's ``eval.ungated`` rule, the ledger (branch, passed over)."""
_LEGACY = {"decision": Decision.PROMOTED, "by": "an earlier Stoker", "at": "",
           "why": "joined before nights were gated (a record without a version)"}


class LedgerError(StokerError):
    """A write that would break one of the line's invariants: nothing was written."""


def decision_of(record: dict[str, Any]) -> dict[str, Any] | None:
    """The night's decision in effect; None while pending."""
    d = record.get("decision")
    if d:
        return dict(d)
    return dict(_LEGACY) if "version" not in record else None


def state(record: dict[str, Any]) -> str:
    """``pending``, or the decision: promoted, held, rolled_back, branch, passed_over."""
    d = decision_of(record)
    return PENDING if d is None else str(d["decision"])


def blessed(record: dict[str, Any]) -> bool:
    """Whether a night may be continued: promoted (by the gate, the rule or a person). Pending is not blessed."""
    return state(record) == Decision.PROMOTED


def _is_head_role(record: dict[str, Any]) -> bool:
    return record.get("parent", {}).get("role", Role.HEAD) == Role.HEAD


def head(line: LineLayout) -> dict[str, Any] | None:
    """The record of the night that joined last as the line's continuation and was promoted; None before the
    first promoted night."""
    heads = [r for r, _ in joined_nights(line) if _is_head_role(r) and blessed(r)]
    return heads[-1] if heads else None


def blessed_nights(lines: Path) -> set[tuple[str, str]]:
    """(ds, corpus) of every night in the weights of a line's head, over every line in ``lines`` (the state's
    ``lines/``): the nights whose documents a model of the line holds. Near-dedup drops a document only as a
    copy of one of these: a night that failed, was held, rolled back or passed over is in no head's weights."""
    out: set[tuple[str, str]] = set()
    for folder in sorted(p for p in lines.iterdir() if p.is_dir()) if lines.is_dir() else []:
        top = head(LineLayout(folder))
        out |= {(str(e["ds"]), str(e.get("corpus", ""))) for e in (top or {}).get("lineage", []) if "ds" in e}
    return out


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def admit(line: LineLayout, night: Night) -> None:
    """A finished night about to join: its join number, and what the ledger checks before it is written. A head
    must continue a promoted night (or the line's init when the line has no head); a branch is decided as it
    joins."""
    nights = joined_nights(line)
    night.seq = max((int(r.get("seq", 0)) for r, _ in nights), default=0) + 1
    if night.parent.get("role", Role.HEAD) != Role.HEAD:
        return
    if night.parent.get("kind") == "night":
        parent = read_night(NightFiles(Path(night.parent["path"])))
        if not blessed(parent):
            raise LedgerError(f"night {night.ds}.{night.corpus} cannot join line {line.name} as its head: its parent, "
                              f"night {parent['ds']}.{parent.get('corpus')}, is {state(parent)}, not promoted")
    elif any(_is_head_role(r) and blessed(r) and (r["ds"], r.get("corpus")) != (night.ds, night.corpus)
             for r, _ in nights):  # a re-run of the line's first night replaces it: not a second start
        raise LedgerError(f"night {night.ds}.{night.corpus} cannot join line {line.name} as its head from "
                          f"{night.parent.get('kind')} weights: the line has a head")


def new_record(night: Night) -> dict[str, Any]:
    """The record of a night as it joins (written by :mod:`stoker.lines.promotion` into the night's new folder)."""
    record = {**asdict(night), "version": RECORD_VERSION}
    if night.parent.get("role", Role.HEAD) != Role.HEAD:
        record["decision"] = {"decision": Decision.BRANCH, "by": "ledger", "at": _now(),
                              "why": "a branch never becomes the head"}
    return record


def write_new(path: Path, record: dict[str, Any]) -> None:
    """A new night's record into its (not yet linked) folder."""
    if record.get("version") != RECORD_VERSION or "seq" not in record:
        raise LedgerError(f"{path}: a night record without version {RECORD_VERSION} or join number: use new_record")
    atomic_write_json(path, record)


def joined(line: LineLayout, night: Night) -> list[str]:
    """After ``night`` joined as the line's head: every pending night before it is passed over (its data is in
    no model the line continues). Returns those nights; the line is checked."""
    passed = []
    if night.parent.get("role", Role.HEAD) == Role.HEAD:
        for r, files in joined_nights(line):
            if int(r.get("seq", 0)) < night.seq and state(r) == PENDING:
                r["decision"] = {"decision": Decision.PASSED_OVER, "by": "ledger", "at": _now(),
                                 "why": f"undecided when night {night.ds}.{night.corpus} continued the line past it"}
                atomic_write_json(files.record, r)
                passed.append(f"{r['ds']}.{r.get('corpus')}")
    check(line)
    return passed


def decide(line: LineLayout, ds: str, corpus: str, decision: dict[str, Any],
           result: dict[str, Any] | None = None) -> dict[str, Any]:
    """A decision on night (``ds``, ``corpus``), with the figures it was made on (``result``: an evaluation, or
    None to keep the recorded ones); returns the decision in effect. The gate's or the rule's never replaces a
    person's, nor a final ``passed_over``/``branch``, nor one a later night was trained on or continued past (a
    cleared evaluate run again: the figures are recorded, the decision stands). Refused (LedgerError, nothing
    written) when it would make a head of a night that a later night continued past, or of one holding a
    rolled-back night, or roll back a night that a pending night continues."""
    night = line.night(ds, corpus)
    if not night.record.is_file():
        raise LedgerError(f"line {line.name} has no night {ds}.{corpus}: `stoker lines show {line.name}` lists them")
    record = read_night(night)
    current = record.get("decision")
    automatic = decision.get("by") in AUTOMATIC
    others = [r for r, _ in joined_nights(line)]  # read once: every rule below asks the same records
    later = [r for r in others if int(r.get("seq", 0)) > int(record.get("seq", 0))
             and _is_head_role(r) and state(r) not in (Decision.HELD, Decision.ROLLED_BACK, Decision.PASSED_OVER)]
    me = (ds, corpus, record.get("topic"))
    continued_by = [r for r in others
                    if me in [(e.get("ds"), e.get("corpus"), e.get("topic")) for e in r.get("lineage", [])[:-1]]]
    built_on = bool(continued_by)
    if current and (current.get("decision") in (Decision.PASSED_OVER, Decision.BRANCH)
                    or (automatic and (current.get("by") not in AUTOMATIC or later or built_on))):
        decision = current  # final, a person's, or one a later night already built on
    elif current and not automatic:
        decision = {**decision, "previous": current}
    if decision is not current and decision["decision"] == Decision.PROMOTED and _is_head_role(record) and later:
        raise LedgerError(f"night {ds}.{corpus} cannot become line {line.name}'s head: night {later[-1]['ds']}."
                          f"{later[-1].get('corpus')} continued the line after it; train a new night instead")
    if decision is not current and decision["decision"] == Decision.ROLLED_BACK:
        waiting = [r for r in continued_by if state(r) == PENDING]
        if waiting:
            raise LedgerError(f"night {ds}.{corpus} cannot be rolled back: night {waiting[0]['ds']}."
                              f"{waiting[0].get('corpus')} continued it and is not decided yet; decide that first")
    before = dict(record)
    record["decision"] = decision
    if result is not None:
        record["eval"] = {name: f["all"] for name, f in result.get("sets", {}).items()}
        if result.get("lm_eval"):
            record["lm_eval"] = result["lm_eval"]
    record.setdefault("version", RECORD_VERSION)
    atomic_write_json(night.record, record)
    try:
        check(line)
    except LedgerError:
        atomic_write_json(night.record, before)  # the write is undone: the line stays as it was
        raise
    return decision


def check(line: LineLayout) -> None:
    """The line's invariants, over every record; a LedgerError names the first broken one."""
    nights = joined_nights(line)
    seqs = [int(r.get("seq", 0)) for r, _ in nights if "version" in r]
    if len(seqs) != len(set(seqs)):
        raise LedgerError(f"line {line.name}: two nights share a join number ({sorted(seqs)})")
    rolled = {(r["ds"], r.get("corpus"), r.get("topic")) for r, _ in nights if state(r) == Decision.ROLLED_BACK}
    for r, files in nights:
        where = f"line {line.name}, night {r['ds']}.{r.get('corpus')} ({files.record})"
        if int(r.get("version", 1)) > RECORD_VERSION:
            raise LedgerError(f"{where}: record version {r['version']} is newer than this Stoker's "
                              f"({RECORD_VERSION}): upgrade Stoker")
        s = state(r)
        if s not in (PENDING, *(d.value for d in Decision)):
            raise LedgerError(f"{where}: unknown state {s!r}")
        if not _is_head_role(r) and s not in (Decision.BRANCH, PENDING) and "version" in r:
            raise LedgerError(f"{where}: a branch is {s}; a branch is never gated")
        if s == PENDING and any(int(o.get("seq", 0)) > int(r.get("seq", 0)) and _is_head_role(o)
                                for o, _ in nights):
            raise LedgerError(f"{where}: pending, but a later night continued the line: it is passed over")
        if r.get("decision") and not r["decision"].get("by"):
            raise LedgerError(f"{where}: a decision without who made it")
    top = head(line)
    if top is not None:
        taught = [e for e in top.get("lineage", []) if (e.get("ds"), e.get("corpus"), e.get("topic")) in rolled]
        if taught:
            raise LedgerError(f"line {line.name}: its head {top['ds']}.{top.get('corpus')} holds rolled-back night "
                              f"{taught[0]['ds']}.{taught[0].get('corpus')}")
