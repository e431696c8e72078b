"""The promotion gate (stoker/lines/gate.py): the decision from an evaluation, a held night never continued, the
line's lease handed from the train task to the task that decides."""

from __future__ import annotations

import json
import math

import pytest
from test_line_rules import _join  # tests/unit/test_line_rules.py

from stoker.exceptions import StokerError
from stoker.layout import LineLayout
from stoker.lines.gate import decide, human_decision, record_decision, regressions
from stoker.lines.lease import LeaseHolder, give_back_lease, hand_over_lease, lease_holder, take_lease
from stoker.lines.ledger import blessed, head
from stoker.lines.nights import read_night
from stoker.lines.parents import choose_parent

pytestmark = pytest.mark.unit


def _result(**sets: tuple[float, float, float]) -> dict:
    """An evaluation: per set, (candidate bpb, blessed bpb, paired stderr of the change)."""
    return {"baseline": "/line/nights/x/hf", "sets": {
        name: {"all": {"docs": 20, "bpb": c, "stderr": 0.05, "baseline_bpb": b, "baseline_stderr": 0.05,
                       "delta": c - b, "delta_stderr": se}} for name, (c, b, se) in sets.items()}}


def test_a_night_is_held_when_a_figure_is_worse_by_more_than_its_noise_or_the_floor():
    clean = _result(night=(2.10, 2.30, 0.02), **{"forgetting:2026-12-01.a": (2.41, 2.40, 0.01)})
    assert decide(clean, "head", 2.0, 0.01)["decision"] == "promoted"  # +0.01: within 2 x 0.01
    forgot = _result(night=(2.10, 2.30, 0.02), **{"forgetting:2026-12-01.a": (2.60, 2.40, 0.01)})
    held = decide(forgot, "head", 2.0, 0.01)
    assert held["decision"] == "held" and [r["set"] for r in held["regressions"]] == ["forgetting:2026-12-01.a"]
    assert "forgetting:2026-12-01.a: 2.6000 bits/byte vs the blessed 2.4000" in held["why"]
    # the floor: a tiny but certain change is not a regression; a noisy big one is
    assert decide(_result(night=(2.305, 2.30, 0.0001)), "head", 2.0, 0.01)["decision"] == "promoted"
    assert decide(_result(night=(2.50, 2.30, 0.15)), "head", 2.0, 0.01)["decision"] == "promoted"
    assert decide(_result(night=(2.70, 2.30, 0.15)), "head", 2.0, 0.01)["decision"] == "held"
    # a diverged model (no number) is held; nothing to compare with is promoted; a branch is not gated
    assert regressions(_result(night=(math.nan, 2.3, math.nan)), 2.0, 0.01)[0]["set"] == "night"
    assert decide({"baseline": None, "sets": {"night": {"all": {"bpb": 3.0}}}}, "head", 2.0, 0.01)["decision"] == \
        "promoted"
    assert decide(forgot, "branch", 2.0, 0.01)["decision"] == "branch"


def test_earlier_nights_sets_have_the_forgetting_floor_and_the_nights_own_set_its_own():
    # a certain +0.03 on an earlier night's documents is forgetting within eval.max_forgetting (0.05) ...
    forgot_a_little = _result(night=(2.10, 2.30, 0.002), **{"forgetting:2026-12-01.a": (2.43, 2.40, 0.002)})
    assert decide(forgot_a_little, "head", 2.0, 0.01, 0.05)["decision"] == "promoted"
    assert decide(forgot_a_little, "head", 2.0, 0.01)["decision"] == "held"  # one floor for all sets
    # ... while the same change on the night's own documents, or +0.06 on the earlier night's, is held
    own = decide(_result(night=(2.33, 2.30, 0.002)), "head", 2.0, 0.01, 0.05)
    assert own["decision"] == "held" and own["regressions"][0]["allowed"] == 0.01
    forgot = decide(_result(night=(2.10, 2.30, 0.002), **{"forgetting:2026-12-01.a": (2.46, 2.40, 0.002)}),
                    "head", 2.0, 0.01, 0.05)
    assert forgot["decision"] == "held" and forgot["regressions"][0]["allowed"] == 0.05
    assert "(0.05 on earlier nights' sets)" in forgot["rule"]


def test_a_held_night_stays_in_the_history_and_the_next_night_continues_the_blessed_head(tmp_path):
    line = LineLayout(tmp_path / "l")
    _join(line, tmp_path, "2026-12-01")
    _join(line, tmp_path, "2026-12-02")
    night = line.night("2026-12-02", "c")
    result = _result(night=(4.0, 2.3, 0.05))
    record_decision(line, "2026-12-02", "c", result, decide(result, "head", 2.0, 0.01))
    assert not blessed(read_night(night)) and read_night(night)["eval"]["night"]["bpb"] == 4.0
    assert "Decision: **held** by gate" in night.card.read_text() and "| night | 20 | 4.0000" in night.card.read_text()
    assert [n.folder.name for n in line.nights()] == ["2026-12-01.c", "2026-12-02.c"]  # still in the history
    assert head(line)["ds"] == "2026-12-01"
    nxt = choose_parent(line, "2026-12-03", "c", "random", "branch")
    assert (nxt.ds, nxt.role) == ("2026-12-01", "head")
    # a decision made again (a re-run of the task) replaces the card's table, never appends a second one
    record_decision(line, "2026-12-02", "c", result, decide(result, "head", 2.0, 0.01))
    assert night.card.read_text().count("## Evaluation on held-out documents") == 1


def _gated(line: LineLayout, tmp_path, ds: str, bpb: float) -> None:
    """Night ds joined and decided by the gate against a blessed 2.3 bits per byte."""
    _join(line, tmp_path, ds)
    result = _result(night=(bpb, 2.3, 0.05))
    record_decision(line, ds, "c", result, decide(result, "head", 2.0, 0.01))


def test_a_person_promotes_a_held_night_or_rolls_back_the_head_and_the_gates_decision_is_kept(tmp_path):
    line = LineLayout(tmp_path / "l")
    _join(line, tmp_path, "2026-12-01")
    _gated(line, tmp_path, "2026-12-02", 2.6)  # held
    assert head(line)["ds"] == "2026-12-01"
    with pytest.raises(StokerError, match="is promoted, not held"):
        human_decision(line, "2026-12-01", "c", "hold", "ann")  # the first night: promoted, nothing to compare with
    done = human_decision(line, "2026-12-02", "c", "promote", "ann (stoker lines decide)", "known shift in the data")
    assert done["decision"] == "promoted" and done["previous"]["decision"] == "held" and done["by"].startswith("ann")
    assert head(line)["ds"] == "2026-12-02"
    card = line.night("2026-12-02", "c").card.read_text()
    assert "Decision: **promoted** by ann (stoker lines decide)" in card and "known shift" in card
    # and back: the head rolled back, the line continues the night before it
    back = human_decision(line, "2026-12-02", "c", "roll-back", "ann (stoker lines decide)")
    assert back["decision"] == "rolled_back"  # the same person again: every earlier decision kept, newest first
    assert [back["previous"]["decision"], back["previous"]["previous"]["decision"]] == ["promoted", "held"]
    assert head(line)["ds"] == "2026-12-01"
    assert (choose_parent(line, "2026-12-03", "c", "random", "branch").ds) == "2026-12-01"


def test_a_held_night_cannot_be_promoted_once_the_line_moved_on(tmp_path):
    line = LineLayout(tmp_path / "l")
    _join(line, tmp_path, "2026-12-01")
    _gated(line, tmp_path, "2026-12-02", 2.6)  # held
    _gated(line, tmp_path, "2026-12-03", 2.2)  # continued 12-01, promoted
    with pytest.raises(StokerError, match="2026-12-03.c continued the line after it"):
        human_decision(line, "2026-12-02", "c", "promote", "ann")
    with pytest.raises(StokerError, match="choose one of promote, hold, roll-back"):
        human_decision(line, "2026-12-02", "c", "approve", "ann")
    with pytest.raises(StokerError, match="is promoted, not held"):
        human_decision(line, "2026-12-03", "c", "hold", "ann")
    assert human_decision(line, "2026-12-02", "c", "roll-back", "ann")["decision"] == "rolled_back"  # held: fine
    assert head(line)["ds"] == "2026-12-03"
    _gated(line, tmp_path, "2026-12-04", 2.2)  # continued 12-03
    with pytest.raises(StokerError, match="is not line l's head"):
        human_decision(line, "2026-12-03", "c", "roll-back", "ann")
    # once the nights after it are rolled back, a held night may be promoted after all
    human_decision(line, "2026-12-04", "c", "roll-back", "ann")
    human_decision(line, "2026-12-03", "c", "roll-back", "ann")
    assert head(line)["ds"] == "2026-12-01"
    assert human_decision(line, "2026-12-02", "c", "promote", "ann")["decision"] == "promoted"
    assert head(line)["ds"] == "2026-12-02"


def test_the_train_task_hands_the_lines_lease_to_the_task_that_decides(tmp_path):
    line = LineLayout(tmp_path / "l")
    train = LeaseHolder(dag_id="refresh_c", run_id="r1", task_id="training.train", corpus="c", ds="2026-12-02",
                        topic="t")
    assert take_lease(line, train, lambda h: True) is None
    assert hand_over_lease(line, train, "training.evaluate")
    gate = LeaseHolder(dag_id="refresh_c", run_id="r1", task_id="training.evaluate", corpus="c", ds="2026-12-02",
                       topic="t")
    other = LeaseHolder(dag_id="refresh_c", run_id="r2", task_id="training.train", corpus="c", ds="2026-12-03",
                        topic="u")
    assert take_lease(line, other, lambda h: True).task_id == "training.evaluate"  # the next night waits
    assert not give_back_lease(line, train) and give_back_lease(line, gate) and lease_holder(line) is None
    assert take_lease(line, other, lambda h: True) is None


def test_lines_show_marks_each_nights_decision_and_plots_its_figure(tmp_path, monkeypatch):
    from stoker.reports import catalog

    monkeypatch.setenv("STOKER_HOME", str(tmp_path))
    line = LineLayout.of("l")
    _join(line, tmp_path, "2026-12-01")
    _gated(line, tmp_path, "2026-12-02", 2.6)  # held
    _gated(line, tmp_path, "2026-12-03", 2.2)  # promoted
    human_decision(line, "2026-12-02", "c", "roll-back", "ann")
    rows = catalog.line_nights("l")
    assert [(r["decision"], r["bpb"], r["head"]) for r in rows] == [
        ("promoted", None, False), ("rolled_back", 2.6, False), ("promoted", 2.2, True)]
    text = catalog.render_line("l", rows).splitlines()
    assert "rolled_back (by hand)" in text[3] and "2.6000 ############" in text[3]
    assert text[4].startswith("* 2026-12-03.c") and "2.2000 #           " in text[4]


def test_the_review_step_shows_the_figures_and_names_who_answered_or_that_nobody_did():
    from stoker.config.eval import REVIEWS, EvalConfig
    from stoker.exceptions import ConfigError
    from stoker.lines.gate import CHOICES, REVIEW_OPTIONS
    from stoker_airflow.operators.review import figures_markdown, who_answered

    assert sorted(REVIEW_OPTIONS.values()) == sorted(CHOICES) and REVIEWS[1:] == tuple(CHOICES)
    forgot = _result(night=(2.10, 2.30, 0.02), **{"forgetting:2026-12-01.a": (2.60, 2.40, 0.01)})
    body = figures_markdown(forgot, decide(forgot, "head", 2.0, 0.01), "pair", "2026-12-02.a")
    assert "The gate held night **2026-12-02.a** of line **pair**: forgetting:2026-12-01.a: 2.6000" in body
    assert "Regressed: forgetting:2026-12-01.a." in body and "| forgetting:2026-12-01.a | 20 | 2.6000" in body
    assert who_answered({"responded_by_user": {"id": "7", "name": "ann"}}, 60) == "ann (Airflow review)"
    assert who_answered({"responded_by_user": None}, 60) == "nobody within eval.approval_timeout_s (60 s)"
    with pytest.raises(ConfigError, match=r"eval.approval_timeout_s = 0: must be in \[1, 2592000\]"):
        EvalConfig(approval_timeout_s=0)


def test_lm_eval_figures_go_to_the_card_and_runs_show_beside_the_gates_and_do_not_decide(tmp_path):
    from stoker.config.corpus import ConfigError
    from stoker.config.eval import EvalConfig
    from stoker.reports.runs import _render_eval

    line = LineLayout(tmp_path / "line")
    _join(line, tmp_path, "2026-12-01")
    result = _result(night=(2.50, 2.30, 0.01))  # held by its bits per byte, whatever the tasks say
    result["lm_eval"] = {"tasks": {"stoker_cloze": {"docs": 16, "metrics": {
        "acc": {"value": 0.75, "stderr": 0.11, "baseline": 0.5, "baseline_stderr": 0.13},
        "acc_norm": {"value": 0.8125, "stderr": None}}}}}
    decision = decide(result, "head", 2.0, 0.01)
    assert decision["decision"] == "held" and [r["set"] for r in decision["regressions"]] == ["night"]
    record_decision(line, "2026-12-01", "c", result, decision)
    card = line.night("2026-12-01", "c").card.read_text()
    assert "| stoker_cloze | acc | 16 | 0.7500 ± 0.1100 | 0.5000 ± 0.1300 |" in card
    assert "| stoker_cloze | acc_norm | 16 | 0.8125 | - |" in card
    human_decision(line, "2026-12-01", "c", "roll-back", "admin")  # a person's decision keeps the table
    assert "| stoker_cloze | acc | 16 | 0.7500 ± 0.1100 |" in line.night("2026-12-01", "c").card.read_text()
    shown = "\n".join(_render_eval({"docs": 3, "per_mille": 5, "bytes": 90, "sequences": 1}, result))
    assert "    stoker_cloze acc 0.7500 ± 0.1100 (16 docs); was 0.5000 ± 0.1300" in shown
    # the settings: tasks need the evaluate step, which runs on nights that held documents out
    with pytest.raises(ConfigError, match=r"eval.lm_eval_tasks = \['x'\].*set eval.holdout_per_mille above 0"):
        EvalConfig(lm_eval_tasks=["x"])
    with pytest.raises(ConfigError, match="eval.lm_eval_limit = 0"):
        EvalConfig(holdout_per_mille=5, lm_eval_tasks=["x"], lm_eval_limit=0)
    with pytest.raises(ConfigError, match="eval.lm_eval_tasks"):
        EvalConfig(holdout_per_mille=5, lm_eval_tasks=[""])


def test_a_persons_decision_is_never_overwritten_by_the_gate_of_a_cleared_evaluate(tmp_path):
    """A person rolled back a night; its evaluate task was then cleared and the gate decided again ("promoted",
    with no previous): the rolled-back night was the head once more. Now the new figures are recorded and the
    person's decision stands."""
    line = LineLayout(tmp_path / "l")
    _join(line, tmp_path, "2026-12-01")
    _gated(line, tmp_path, "2026-12-02", 2.2)  # better: promoted by the gate
    assert head(line)["ds"] == "2026-12-02"
    human_decision(line, "2026-12-02", "c", "roll-back", "ann")
    assert head(line)["ds"] == "2026-12-01"
    result = _result(night=(2.1, 2.3, 0.05))
    kept = record_decision(line, "2026-12-02", "c", result, decide(result, "head", 2.0, 0.01))
    assert (kept["decision"], kept["by"]) == ("rolled_back", "ann")
    record = json.loads(line.night("2026-12-02", "c").record.read_text())
    assert record["decision"]["decision"] == "rolled_back" and record["eval"]["night"]["bpb"] == 2.1
    assert head(line)["ds"] == "2026-12-01"


def test_a_person_cannot_decide_while_another_night_of_the_line_trains(home, capsys):
    """`stoker lines decide` took no lease: promoting a held night while the next one trained turned that one into
    a branch. While a night holds the line's lease, the command refuses, naming it, and changes nothing."""
    from stoker_local.cli import main

    line = LineLayout.of("busy")
    _join(line, home, "2026-12-01")
    _gated(line, home, "2026-12-02", 2.6)  # held
    trains = LeaseHolder(dag_id="refresh_busy", run_id="r3", task_id="training.train", corpus="c",
                         ds="2026-12-03", topic="t")
    assert take_lease(line, trains, lambda h: True) is None
    assert main(["lines", "decide", "busy", "2026-12-02.c", "promote"]) == 2
    assert "line busy is busy: night 2026-12-03 of c" in capsys.readouterr().err
    assert read_night(line.night("2026-12-02", "c"))["decision"]["decision"] == "held"  # unchanged
    assert give_back_lease(line, trains)
    assert main(["lines", "decide", "busy", "2026-12-02.c", "promote"]) == 0
    assert head(line)["ds"] == "2026-12-02"
