"""A model line's ledger as a state machine: Hypothesis drives ``stoker.lines`` (the train task's parent choice and
join, the evaluate task's gate and ``eval.ungated`` rule, a person's decisions) through random histories of two
corpora feeding one line: nights that train and join, evaluations that decide better or worse, fail for good (the
night stays pending and the next night continues past it), are cleared and decide again; backfills that branch;
people who promote, hold and roll back any night at any moment. A small reference model says what each night's
state and the head must be; after every step the records must match it and :func:`stoker.lines.ledger.check`
must pass: the head is promoted, no pending night is a parent, nothing a rolled-back night taught is the head, a
person's decision is never overwritten by the gate, and the head's lineage is its chain of parents.

The real modules write real files (a checkpoint marker, an export folder, the records and links). ``make soak``
runs many more histories (``STOKER_STATE_EXAMPLES``; 1000 in the suite)."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from test_line_rules import _night  # tests/unit/test_line_rules.py

from stoker.exceptions import StokerError
from stoker.layout import CHECKPOINT_COMPLETE, LineLayout, NightFiles
from stoker.lines import ledger
from stoker.lines.gate import human_decision, record_decision, ungated
from stoker.lines.nights import read_night
from stoker.lines.parents import choose_parent
from stoker.lines.promotion import promote

pytestmark = pytest.mark.unit

CORPORA = ("web", "code")
Key = tuple[str, str]
"""(ds, corpus) of a night."""
CHOICES = {"promote": "promoted", "hold": "held", "roll-back": "rolled_back"}
BLOCKS = ("held", "rolled_back", "passed_over")
"""States of a later night that do not stop an earlier one from being promoted (they continue nothing)."""


@dataclass
class Ref:
    """A night as the reference model sees it."""

    seq: int
    role: str
    lineage: list[Key]
    """Its model's nights, oldest first, itself last."""
    state: str = "pending"
    by: str = ""
    evaluating: bool = True
    """Its evaluate task may still decide it (it holds the line's lease)."""
    history: list[str] = field(default_factory=list)


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="ledger-states-"))
        self.line = LineLayout(self.root / "line")
        self.nights: dict[Key, Ref] = {}
        self.day = 1
        self.backfill = 27

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    # the reference model
    def head(self) -> Key | None:
        heads = [(r.seq, k) for k, r in self.nights.items() if r.role == "head" and r.state == "promoted"]
        return max(heads)[1] if heads else None

    def evaluating(self) -> Key | None:
        return next((k for k, r in self.nights.items() if r.state == "pending" and r.evaluating), None)

    def later(self, key: Key) -> list[Key]:
        """Nights that continued the line after ``key`` (what forbids promoting it)."""
        me = self.nights[key]
        return [k for k, r in self.nights.items() if r.seq > me.seq and r.role == "head" and r.state not in BLOCKS]

    def head_holds_rolled_back(self, states: dict[Key, str]) -> bool:
        heads = [(r.seq, k) for k, r in self.nights.items() if r.role == "head" and states[k] == "promoted"]
        if not heads:
            return False
        return any(states[k] == "rolled_back" for k in self.nights[max(heads)[1]].lineage)

    def apply(self, key: Key, new: str, by: str) -> bool:
        """``key`` decided ``new``; False (nothing changed) when the result's head would hold a rolled-back night."""
        states = {k: r.state for k, r in self.nights.items()}
        states[key] = new
        if self.head_holds_rolled_back(states):
            return False
        self.nights[key].state, self.nights[key].by = new, by
        self.nights[key].history.append(new)
        return True

    # the real line, by the operators' own functions
    def join(self, ds: str, corpus: str) -> None:
        parent = choose_parent(self.line, ds, corpus, "random", "branch")
        top = self.head()
        if ds < f"2026-12-{self.day:02d}" and top is not None:  # a backfill, older than the head: a branch
            assert parent.role == "branch"
        else:
            assert parent.role == "head" and (parent.ds, parent.corpus) == (top or ("", ""))
        lineage = read_night(NightFiles(Path(parent.path)))["lineage"] if parent.kind == "night" else None
        n = _night(self.line.name, ds, parent.to_dict(), lineage=lineage, corpus=corpus)
        ckpts, export = self.root / f"ckpt-{ds}-{corpus}", self.root / f"export-{ds}-{corpus}"
        (ckpts / "step00000010").mkdir(parents=True)
        (ckpts / "step00000010" / CHECKPOINT_COMPLETE).write_text("{}")
        export.mkdir()
        promote(self.line, n, ckpts, export)
        seq = len(self.nights) + 1
        before = self.nights[(parent.ds, parent.corpus)].lineage if parent.kind == "night" else []
        if parent.role == "head":
            for r in self.nights.values():
                if r.state == "pending":
                    r.state, r.by = "passed_over", "ledger"
        self.nights[(ds, corpus)] = Ref(seq=seq, role=parent.role, lineage=[*before, (ds, corpus)],
                                        state="pending" if parent.role == "head" else "branch",
                                        by="" if parent.role == "head" else "ledger",
                                        evaluating=parent.role == "head")

    @precondition(lambda self: self.evaluating() is None)  # the lease: one night between launch and decision
    @rule(corpus=st.sampled_from(CORPORA), next_day=st.booleans())
    def train(self, corpus: str, next_day: bool) -> None:
        self.day += next_day
        ds = f"2026-12-{self.day:02d}"
        if (ds, corpus) in self.nights:
            self.day += 1
            ds = f"2026-12-{self.day:02d}"
        self.join(ds, corpus)

    @precondition(lambda self: self.evaluating() is None and self.head() is not None and self.backfill > 1)
    @rule(corpus=st.sampled_from(CORPORA))
    def train_a_backfill(self, corpus: str) -> None:
        self.backfill -= 1
        self.join(f"2026-11-{self.backfill:02d}", corpus)

    def gate(self, key: Key, outcome: str, rule_decides: bool) -> dict | None:
        decision = (ungated("promote" if outcome == "promoted" else "hold", "no held-out document") if rule_decides
                    else {"decision": outcome, "by": "gate", "at": "", "why": "the figures"})
        result = {"sets": {} if rule_decides else {"night": {"all": {"docs": 3, "bpb": 2.0, "stderr": 0.1}}}}
        try:
            return record_decision(self.line, key[0], key[1], result, decision)
        except ledger.LedgerError:
            return None

    @precondition(lambda self: self.evaluating() is not None)
    @rule(outcome=st.sampled_from(["promoted", "held"]), rule_decides=st.booleans())
    def evaluate(self, outcome: str, rule_decides: bool) -> None:
        key = self.evaluating()
        got = self.gate(key, outcome, rule_decides)
        self.nights[key].evaluating = False
        assert (got is not None) == self.apply(key, outcome, "rule" if rule_decides else "gate")

    @precondition(lambda self: self.evaluating() is not None)
    @rule()
    def evaluate_fails_for_good(self) -> None:
        self.nights[self.evaluating()].evaluating = False  # the lease is given back; the night stays pending

    @precondition(lambda self: self.nights)
    @rule(data=st.data(), outcome=st.sampled_from(["promoted", "held"]))
    def evaluate_cleared_and_run_again(self, data, outcome: str) -> None:
        key = data.draw(st.sampled_from(sorted(self.nights)))
        me = self.nights[key]
        got = self.gate(key, outcome, False)
        built_on = any(key in r.lineage[:-1] for r in self.nights.values())
        keeps = me.state in ("passed_over", "branch") or (me.state != "pending" and (
            me.by not in ledger.AUTOMATIC or self.later(key) or built_on))
        if keeps:
            assert got is not None and got["decision"] == me.state
        elif outcome == "promoted" and self.later(key):
            assert got is None
        else:
            assert (got is not None) == self.apply(key, outcome, "gate")

    @precondition(lambda self: self.nights)
    @rule(data=st.data(), choice=st.sampled_from(sorted(CHOICES)))
    def a_person_decides(self, data, choice: str) -> None:
        key = data.draw(st.sampled_from(sorted(self.nights)))
        me = self.nights[key]
        allowed = not (
            me.state in ("branch", "passed_over")
            or (choice == "roll-back" and me.state == "promoted" and key != self.head())
            or (choice == "hold" and me.state not in ("held", "pending"))
            or (choice == "promote" and self.later(key))
            or (choice == "roll-back" and any(r.state == "pending" and key in r.lineage[:-1]
                                              for r in self.nights.values())))
        try:
            done = human_decision(self.line, key[0], key[1], choice, "ann")
        except StokerError:
            done = None
        if not allowed:
            assert done is None
            return
        decided_before = me.state != "pending"
        assert (done is not None) == self.apply(key, CHOICES[choice], "ann")
        if done is not None:  # who decided, and the decision it replaced kept beside it
            assert done["by"] == "ann" and ("previous" in done) == decided_before

    @invariant()
    def the_records_are_the_model(self) -> None:
        ledger.check(self.line)
        got = {(r["ds"], r["corpus"]): ledger.state(r) for r, _ in ledger.joined_nights(self.line)}
        assert got == {k: r.state for k, r in self.nights.items()}
        top = ledger.head(self.line)
        assert (None if top is None else (top["ds"], top["corpus"])) == self.head()
        if top is not None:  # the model card's nights are exactly those in the head's weights
            assert [(e["ds"], e["corpus"]) for e in top["lineage"] if "ds" in e] == self.nights[self.head()].lineage

    @invariant()
    def nothing_trains_from_an_undecided_or_rolled_back_night(self) -> None:
        for r in self.nights.values():
            if r.role == "head" and len(r.lineage) > 1:  # its parent was promoted when it trained, and stays decided
                assert self.nights[r.lineage[-2]].state not in ("pending", "passed_over", "held")


LedgerMachine.TestCase.settings = settings(max_examples=int(os.environ.get("STOKER_STATE_EXAMPLES", "1000")),
                                           stateful_step_count=20, deadline=None)
test_the_ledger_follows_its_reference_model = LedgerMachine.TestCase
