"""The line's ledger by example: each path by which a night became the head without a decision, or a
decision was lost, as a user met it (issue 32); the state machine (test_line_ledger_states.py) covers the
histories in between."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from test_line_rules import _join  # tests/unit/test_line_rules.py

from stoker.exceptions import StokerError
from stoker.layout import LineLayout, RunLayout
from stoker.lines import ledger
from stoker.lines.gate import human_decision, record_decision
from stoker.lines.lease import LeaseHolder, lease_holder, take_lease
from stoker.lines.nights import read_night
from stoker.lines.parents import choose_parent
from stoker.run.manifest import Manifest, PartitionRange, write_manifest

pytestmark = pytest.mark.unit


def _state(line: LineLayout, ds: str, corpus: str = "c") -> str:
    return ledger.state(read_night(line.night(ds, corpus)))


def _gate(line: LineLayout, ds: str, decision: str) -> dict:
    return record_decision(line, ds, "c", {"sets": {"night": {"all": {"docs": 4, "bpb": 2.0, "stderr": 0.1}}}},
                           {"decision": decision, "by": "gate", "at": "", "why": "the figures"})


def test_a_joined_night_is_pending_and_neither_the_head_nor_a_parent_until_it_is_decided(tmp_path):
    """A night joined as head as soon as it trained and "no decision" counted as blessed: a night whose evaluate
    never ran (upstream_failed), or failed for good, was the line's head, and the next night trained from it."""
    line = LineLayout(tmp_path / "l")
    _join(line, tmp_path, "2026-12-01")
    _join(line, tmp_path, "2026-12-02", decided=False)
    assert _state(line, "2026-12-02") == "pending"
    assert ledger.head(line)["ds"] == "2026-12-01"
    nxt = choose_parent(line, "2026-12-03", "c", "random", "branch")
    assert (nxt.ds, nxt.role) == ("2026-12-01", "head")
    # decided (here by a person, `stoker lines decide` on an undecided night): now it is the head
    assert human_decision(line, "2026-12-02", "c", "promote", "ann")["decision"] == "promoted"
    assert ledger.head(line)["ds"] == "2026-12-02" and "previous" not in read_night(line.night("2026-12-02", "c"))[
        "decision"]


def test_a_night_the_line_continued_past_undecided_is_passed_over_and_says_so(home):
    from stoker.reports import catalog

    line = LineLayout.of("l")
    _join(line, home, "2026-12-01")
    _join(line, home, "2026-12-02", decided=False)  # its evaluate failed for good: the lease went on
    _join(line, home, "2026-12-03")  # continued 12-01
    record = read_night(line.night("2026-12-02", "c"))
    assert record["decision"]["decision"] == "passed_over" and "2026-12-03.c continued the line past it" in record[
        "decision"]["why"]
    with pytest.raises(StokerError, match="passed_over: a later night continued the line before it was decided"):
        human_decision(line, "2026-12-02", "c", "promote", "ann")
    # a cleared evaluate of it decides nothing now: its figures are kept, it stays passed over
    assert _gate(line, "2026-12-02", "promoted")["decision"] == "passed_over"
    rows = catalog.line_nights("l")  # `stoker lines show`
    assert [(r["decision"], r["head"]) for r in rows] == [("promoted", False), ("passed_over", False),
                                                          ("promoted", True)]
    assert "passed_over" in catalog.render_line("l", rows)


def test_a_person_cannot_bring_back_as_head_what_a_rolled_back_night_taught(tmp_path):
    """Rolling back the head D-1 and then promoting the held night D (trained from D-1) made D-1's training the
    head again."""
    line = LineLayout(tmp_path / "l")
    _join(line, tmp_path, "2026-12-01")
    _join(line, tmp_path, "2026-12-02")
    _join(line, tmp_path, "2026-12-03", decided=False)
    _gate(line, "2026-12-03", "held")
    human_decision(line, "2026-12-02", "c", "roll-back", "ann")
    assert ledger.head(line)["ds"] == "2026-12-01"
    with pytest.raises(StokerError, match="holds rolled-back night 2026-12-02.c"):
        human_decision(line, "2026-12-03", "c", "promote", "ann")
    assert _state(line, "2026-12-03") == "held" and ledger.head(line)["ds"] == "2026-12-01"  # nothing written


def test_a_night_a_pending_night_continues_cannot_be_rolled_back_until_that_one_is_decided(tmp_path):
    line = LineLayout(tmp_path / "l")
    _join(line, tmp_path, "2026-12-01")
    _join(line, tmp_path, "2026-12-02", decided=False)
    with pytest.raises(StokerError, match="2026-12-02.c continued it and is not decided yet"):
        human_decision(line, "2026-12-01", "c", "roll-back", "ann")
    human_decision(line, "2026-12-02", "c", "hold", "ann")
    assert human_decision(line, "2026-12-01", "c", "roll-back", "ann")["decision"] == "rolled_back"
    assert ledger.head(line) is None


def test_a_gates_decision_that_a_later_night_built_on_is_not_changed_by_a_cleared_evaluate(tmp_path):
    """A cleared evaluate of a night that the next night already trained from decided again: "held" would leave a
    night of the line trained from a held night."""
    line = LineLayout(tmp_path / "l")
    _join(line, tmp_path, "2026-12-01")
    _join(line, tmp_path, "2026-12-02")
    kept = _gate(line, "2026-12-01", "held")
    assert kept["decision"] == "promoted" and _state(line, "2026-12-01") == "promoted"
    assert read_night(line.night("2026-12-01", "c"))["eval"]["night"]["bpb"] == 2.0  # the new figures recorded


def test_records_of_an_earlier_stoker_read_as_promoted_and_a_newer_ones_are_refused(tmp_path):
    line = LineLayout(tmp_path / "l")
    _join(line, tmp_path, "2026-12-01")
    night = line.night("2026-12-01", "c")
    record = read_night(night)
    old = {k: v for k, v in record.items() if k not in ("version", "decision")}
    night.record.write_text(json.dumps(old))
    assert ledger.state(old) == "promoted" and ledger.decision_of(old)["by"] == "an earlier Stoker"
    assert ledger.head(line)["ds"] == "2026-12-01"
    night.record.write_text(json.dumps({**record, "version": ledger.RECORD_VERSION + 1}))
    with pytest.raises(ledger.LedgerError, match="record version 3 is newer than this Stoker's"):
        ledger.check(line)


def _manifest(ds: str, docs: int) -> Manifest:
    return Manifest(run_id=f"c/{ds}", corpus="c", ds=ds, topic=f"stoker.c.{ds}.a1",
                    partitions=[PartitionRange(partition=0, start_offset=0, end_offset=10, sequences=10)],
                    seq_len=64, dtype="uint16", tokenizer_path="t", tokenizer_sha256="x", vocab_size=10,
                    docs_in=5, docs_kept=5, docs_dropped={}, tokens=640, padding_tokens=0, sequences=10,
                    source_uri="data", created_at="2026-12-01T00:00:00", holdout={"docs": docs, "per_mille": 5})


@pytest.mark.parametrize("rule, state", [("promote", "promoted"), ("hold", "held")])
def test_a_night_with_no_held_out_document_is_decided_by_the_corpus_rule_and_keeps_the_lease_till_then(
        home, rule, state):
    """With the default ``holdout_per_mille: 0`` (or a night too small to hold a document out) the evaluate task
    was skipped and the night stayed undecided, continuable, for good. Now ``eval.ungated`` decides it, and its
    record says the rule did."""
    from stoker.config.corpus import TrainConfig
    from stoker_airflow.operators.evaluate import NightEvalOperator
    from tests.support.trainer_tools import write_plan

    line = LineLayout.of("c")
    _join(line, home, "2026-12-01")
    _join(line, home, "2026-12-02", decided=False)
    run = RunLayout.of("c", "2026-12-02")
    write_manifest(run.run_dir, _manifest("2026-12-02", 0))
    write_plan(run.manifest, TrainConfig(line="c"), {"holdout_per_mille": 0, "ungated": rule})
    me = LeaseHolder(dag_id="refresh_c", run_id="r", task_id="training.evaluate", corpus="c", ds="2026-12-02",
                     topic="stoker.c.2026-12-02.a1")
    assert take_lease(line, me, holder_alive=lambda h: True) is None
    out = NightEvalOperator(task_id="evaluate", manifest_path=str(run.manifest), retries=2).execute(
        {"ti": SimpleNamespace(dag_id="refresh_c", run_id="r", task_id="training.evaluate", try_number=1)})
    decision = read_night(line.night("2026-12-02", "c"))["decision"]
    assert (decision["decision"], decision["by"], decision["rule"]) == (state, "rule", f"eval.ungated: {rule}")
    assert out["decision"]["decision"] == state and lease_holder(line) is None  # decided: the lease goes on
    assert ledger.head(line)["ds"] == ("2026-12-02" if rule == "promote" else "2026-12-01")
    assert json.loads(run.evaluation.read_text())["decision"]["by"] == "rule"


def test_no_persons_decision_races_a_night_that_holds_the_lease_whichever_path_it_comes_by(tmp_path):
    """`stoker lines decide` refused while another night trained, but the review step and `stoker refresh
    --decision` did not: promoting a held night then turned the training night into a branch."""
    line = LineLayout(tmp_path / "l")
    _join(line, tmp_path, "2026-12-01")
    _join(line, tmp_path, "2026-12-02", decided=False)
    _gate(line, "2026-12-02", "held")
    trains = LeaseHolder(dag_id="refresh_c", run_id="r3", task_id="training.train", corpus="c", ds="2026-12-03",
                         topic="t3")
    assert take_lease(line, trains, holder_alive=lambda h: True) is None
    review = LeaseHolder(dag_id="refresh_c", run_id="r2", task_id="training.review", corpus="c", ds="2026-12-02",
                         topic="t2")
    with pytest.raises(StokerError, match="line l is busy: night 2026-12-03 of c"):
        human_decision(line, "2026-12-02", "c", "promote", "ann (Airflow review)", run=review)
    assert _state(line, "2026-12-02") == "held"
    # the lease of the deciding run itself does not count (a run's own night)
    mine = LeaseHolder(dag_id="refresh_c", run_id="r3", task_id="training.review", corpus="c", ds="2026-12-03",
                       topic="t3")
    assert human_decision(line, "2026-12-02", "c", "roll-back", "ann", run=mine)["decision"] == "rolled_back"
