"""One night of a model line trains at a time, also in the gaps of the line's Airflow pool: a train
task is out of its pool slot between its trigger firing and its resume (`scheduled`) and between a
failed try and its retry (`up_for_retry`). The line's training lease covers those gaps (CI caught
two nights of one line training at once under the scheduler: the second did not continue the first)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from stoker.config.corpus import TrainConfig
from stoker.layout import LineLayout, RunLayout
from stoker.lines.lease import LeaseHolder, lease_holder, take_lease
from stoker.run.manifest import Manifest, PartitionRange, write_manifest

pytestmark = pytest.mark.unit


PAIR = TrainConfig(line="pair")
"""The train settings of the corpora that share line ``pair``."""

def _manifest(corpus: str, ds: str = "2026-12-01") -> Manifest:
    return Manifest(run_id=f"{corpus}/{ds}", corpus=corpus, ds=ds, topic=f"stoker.{corpus}.{ds}.a1",
                    partitions=[PartitionRange(partition=0, start_offset=0, end_offset=10, sequences=10)],
                    seq_len=64, dtype="uint16", tokenizer_path="t", tokenizer_sha256="x", vocab_size=10,
                    docs_in=5, docs_kept=5, docs_dropped={}, tokens=640, padding_tokens=0, sequences=10,
                    source_uri="data", created_at="2026-12-01T00:00:00")


def _ti(corpus: str, try_number: int = 1) -> SimpleNamespace:
    return SimpleNamespace(dag_id=f"refresh_{corpus}", run_id="manual__2026-12-01", task_id="training.train",
                           try_number=try_number)


def _operator(home, corpus: str, retries: int = 2):
    from stoker_airflow.operators.train import DeepSpeedTrainOperator
    from tests.support.trainer_tools import write_plan

    run = RunLayout.of(corpus, "2026-12-01")
    write_manifest(run.run_dir, _manifest(corpus))
    write_plan(run.manifest, PAIR)  # the corpus feeds line `pair`, as its plan says
    return DeepSpeedTrainOperator(task_id="train", manifest_path=str(run.manifest), retries=retries)


def _holder(corpus: str) -> LeaseHolder:
    return LeaseHolder(dag_id=f"refresh_{corpus}", run_id="manual__2026-12-01", task_id="training.train",
                       corpus=corpus, ds="2026-12-01", topic=f"stoker.{corpus}.2026-12-01.a1")


def test_a_night_waits_out_of_the_pool_while_another_night_of_its_line_holds_the_lease(home, monkeypatch):
    from airflow.sdk.exceptions import AirflowRescheduleException

    from stoker_airflow import lines

    lines.take_line_lease(PAIR, _manifest("pair_a"), _ti("pair_a"),
                          alive=lambda h: pytest.fail("a free lease asks nobody"))
    asked = []
    monkeypatch.setattr(lines, "_task_alive", lambda h: asked.append(h.corpus) or True)  # pair_a: `scheduled`
    op = _operator(home, "pair_b")
    with pytest.raises(AirflowRescheduleException):
        op.execute({"ti": _ti("pair_b")})
    assert asked == ["pair_a"]
    assert not list((RunLayout.of("pair_b", "2026-12-01").run_dir / "train").glob("*"))  # nothing launched
    assert lease_holder(LineLayout.of("pair")).corpus == "pair_a"


def test_the_lease_is_given_back_when_the_night_joined_or_failed_for_good_and_kept_for_a_retry(home, monkeypatch):
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from stoker_airflow import lines

    layout = LineLayout.of("pair")
    op = _operator(home, "pair_a", retries=2)
    import stoker_airflow.operators.train as ops

    monkeypatch.setattr(ops, "join_line", lambda *a: SimpleNamespace(folder=home / "night"))
    lines.take_line_lease(PAIR, _manifest("pair_a"), _ti("pair_a"))
    with pytest.raises(AirflowException) as e:  # died, restarts left: the retry continues this night
        op.execute_complete({"ti": _ti("pair_a", 1)}, {"status": "trainer_failed", "rc": -9, "lag": 4})
    assert not isinstance(e.value, AirflowFailException)
    assert lease_holder(layout).corpus == "pair_a"
    op.execute_complete({"ti": _ti("pair_a", 2)}, {"status": "caught_up", "rc": 0, "lag": 0})
    assert lease_holder(layout) is None  # joined: the next night may train

    lines.take_line_lease(PAIR, _manifest("pair_a"), _ti("pair_a"))
    with pytest.raises(AirflowFailException):  # a relaunch cannot fix a timeout
        op.execute_complete({"ti": _ti("pair_a", 1)}, {"status": "timeout", "lag": 4, "partitions": {"0": 4}})
    assert lease_holder(layout) is None


def test_a_holder_whose_task_is_over_is_taken_over_and_a_retry_keeps_its_own(home):
    from stoker.lines.lease import give_back_lease, take_lease

    layout = LineLayout.of("pair")
    assert take_lease(layout, _holder("pair_a"), holder_alive=lambda h: True) is None
    assert take_lease(layout, _holder("pair_a"), holder_alive=lambda h: pytest.fail("its own")) is None  # a retry
    assert take_lease(layout, _holder("pair_b"), holder_alive=lambda h: True).corpus == "pair_a"
    assert take_lease(layout, _holder("pair_b"), holder_alive=lambda h: False) is None  # pair_a died with its worker
    assert lease_holder(layout).corpus == "pair_b"
    assert not give_back_lease(layout, _holder("pair_a"))  # not its to give back
    assert give_back_lease(layout, _holder("pair_b")) and lease_holder(layout) is None


def test_an_evaluate_try_that_fails_and_will_be_retried_keeps_the_lease(home, monkeypatch):
    """After training the lease is the evaluate task's: until the gate decides, the line's next night must not
    train from this night. Before, the evaluate task gave it back in a ``finally``, also when its try raised and
    Airflow would run it again; the next night took it within 20 s and continued an ungated night."""
    from stoker_airflow.operators.evaluate import NightEvalOperator
    from tests.support.trainer_tools import write_plan

    run = RunLayout.of("pair_a", "2026-12-01")
    m = _manifest("pair_a")
    m.holdout = {"docs": 3, "per_mille": 20}
    write_manifest(run.run_dir, m)
    write_plan(run.manifest, PAIR)
    op = NightEvalOperator(task_id="evaluate", manifest_path=str(run.manifest), retries=2)
    monkeypatch.setattr(op, "evaluate", lambda *a: (_ for _ in ()).throw(RuntimeError("the scorer died")))
    evaluate_ti = SimpleNamespace(dag_id="refresh_pair_a", run_id="manual__2026-12-01", task_id="training.evaluate",
                                  try_number=1)
    assert take_lease(LineLayout.of("pair"), LeaseHolder(
        dag_id="refresh_pair_a", run_id="manual__2026-12-01", task_id="training.evaluate", corpus="pair_a",
        ds="2026-12-01", topic=m.topic), holder_alive=lambda h: True) is None
    for try_number in (1, 2):
        evaluate_ti.try_number = try_number
        with pytest.raises(RuntimeError, match="the scorer died"):
            op.execute({"ti": evaluate_ti})
        assert lease_holder(LineLayout.of("pair")).task_id == "training.evaluate"  # a retry comes: kept
    evaluate_ti.try_number = 3  # the last: failed for good, the line's next night may train
    with pytest.raises(RuntimeError):
        op.execute({"ti": evaluate_ti})
    assert lease_holder(LineLayout.of("pair")) is None


def test_a_cleared_runs_train_task_takes_back_the_lease_its_evaluate_task_held(home):
    """After training the lease is the run's evaluate task's. A clear of the run sets that task back to no state,
    which counts as alive: the re-run's train task waited for it every 20 s for ever (the evaluate task runs
    only after it), and the whole line with it. A night of the same DAG run now takes its own lease back; another
    run's night still waits."""
    from stoker.lines.lease import hand_over_lease

    layout = LineLayout.of("pair")
    train = _holder("pair_a")
    assert take_lease(layout, train, holder_alive=lambda h: True) is None
    assert hand_over_lease(layout, train, "training.evaluate")
    other_night = _holder("pair_b")
    assert take_lease(layout, other_night, holder_alive=lambda h: True).task_id == "training.evaluate"
    cleared = _holder("pair_a")  # the same run's train task, run again after the clear
    assert take_lease(layout, cleared, holder_alive=lambda h: pytest.fail("its own run's lease")) is None
    assert lease_holder(layout).task_id == "training.train"
