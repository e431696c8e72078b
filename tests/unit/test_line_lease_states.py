"""The line's training lease as a state machine: Hypothesis drives ``stoker.lines.lease`` through random histories
of takes, give-backs and hand-overs by the tasks of several nights (some alive, some dead), including the train
task of a cleared run taking back what its evaluate task held, and checks every step against a small reference
model of who must hold the lease (the nights' records are the ledger's: test_line_ledger_states.py)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from stoker.layout import LineLayout
from stoker.lines.lease import LeaseHolder, give_back_lease, hand_over_lease, lease_holder, take_lease

pytestmark = pytest.mark.unit

TASKS = ("training.train", "training.evaluate")
NIGHTS = (("refresh_web", "scheduled__2026-12-01"), ("refresh_web", "scheduled__2026-12-02"),
          ("refresh_code", "scheduled__2026-12-01"))
"""(DAG, run) of three nights that feed one line: two of one corpus, one of another on the same date."""

holders = st.builds(lambda night, task: (night, task), st.sampled_from(NIGHTS), st.sampled_from(TASKS))


def _holder(key: tuple[tuple[str, str], str]) -> LeaseHolder:
    (dag, run), task = key
    return LeaseHolder(dag_id=dag, run_id=run, task_id=task, corpus=dag.removeprefix("refresh_"),
                       ds=run.rsplit("__", 1)[1], topic=f"stoker.{dag}.{run}")


class LeaseMachine(RuleBasedStateMachine):
    """The lease file against ``self.model``: None, or ((dag, run), task) of the holder."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="lease-states-"))
        self.line = LineLayout(self.root / "line")
        self.model: tuple[tuple[str, str], str] | None = None

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    @rule(me=holders, others_alive=st.booleans())
    def take(self, me, others_alive: bool) -> None:
        cur = self.model
        got = take_lease(self.line, _holder(me), holder_alive=lambda h: others_alive)
        if cur is None or cur == me or cur[0] == me[0] or not others_alive:
            assert got is None  # free, its own, its own run's (a cleared run), or a dead holder's: taken
            self.model = me
        else:
            assert got is not None and (got.dag_id, got.run_id) == cur[0] and got.task_id == cur[1]

    @rule(me=holders)
    def give_back(self, me) -> None:
        given = give_back_lease(self.line, _holder(me))
        assert given == (self.model == me)  # only the holder gives it back; anyone else changes nothing
        if given:
            self.model = None

    @rule(me=holders, to=st.sampled_from(TASKS))
    def hand_over(self, me, to: str) -> None:
        handed = hand_over_lease(self.line, _holder(me), to)
        assert handed == (self.model == me)
        if handed:
            self.model = (me[0], to)  # a night's train task hands it to its own run's gate, never to another run

    @invariant()
    def the_file_is_the_model(self) -> None:
        h = lease_holder(self.line)
        assert (None if h is None else ((h.dag_id, h.run_id), h.task_id)) == self.model


LeaseMachine.TestCase.settings = settings(max_examples=int(os.environ.get("STOKER_STATE_EXAMPLES", "1000")),
                                          stateful_step_count=25, deadline=None)
test_the_lease_follows_its_reference_model = LeaseMachine.TestCase
