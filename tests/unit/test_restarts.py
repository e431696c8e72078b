"""A trainer that dies is relaunched by the train task's own retries, a bounded number of times, and
the logs of a relaunched trainer read as one life: the steps after its last checkpoint count once."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from stoker.layout import RunLayout, TrainerFiles
from stoker.run.manifest import Manifest, PartitionRange, write_manifest
from stoker_airflow.triggers.kafka import TRAINER_LOST
from training.metrics import counted_steps, open_log, read_log, read_metrics, trained_keys

pytestmark = pytest.mark.unit


def _manifest() -> Manifest:
    return Manifest(run_id="c/2026-12-01", corpus="c", ds="2026-12-01", topic="stoker.c.20261201.a1",
                    partitions=[PartitionRange(partition=0, start_offset=0, end_offset=100, sequences=100)],
                    seq_len=256, dtype="uint16", tokenizer_path="t", tokenizer_sha256="x", vocab_size=10,
                    docs_in=50, docs_kept=40, docs_dropped={"duplicate": 10}, tokens=25_000, padding_tokens=700,
                    sequences=100, source_uri="data", created_at="2026-12-01T00:00:00")


def test_a_resumed_life_replaces_the_steps_after_the_checkpoint():
    rows = [{"step": s} for s in (1, 2, 3, 4, 5, 6, 4, 5, 6, 7, 2, 3)]
    assert [r["step"] for r in counted_steps(rows)] == [1, 2, 3]  # the last life resumed from step 1
    rows = [{"step": s, "life": 1} for s in (1, 2, 3, 4)] + [{"step": s, "life": 2} for s in (3, 4, 5)]
    assert [(r["step"], r["life"]) for r in counted_steps(rows)] == [(1, 1), (2, 1), (3, 2), (4, 2), (5, 2)]


def test_a_relaunch_starts_a_fresh_line_after_a_torn_one(tmp_path):
    files = TrainerFiles(tmp_path)
    log0 = tmp_path / "keys.0.jsonl"
    log0.write_text('{"step": 1, "keys": ["a", "b"]}\n{"step": 2, "keys": ["c", "d"]}\n{"step": 3, "ke')  # killed
    with open_log(log0) as f:  # the relaunch, resumed from a checkpoint at step 1
        f.write(json.dumps({"step": 2, "keys": ["c", "d"]}) + "\n" + json.dumps({"step": 3, "keys": ["e"]}) + "\n")
    (tmp_path / "keys.1.jsonl").write_text('{"step": 1, "keys": ["x"]}\n')
    assert [r["step"] for r in read_log(log0)] == [1, 2, 2, 3]  # the torn line is skipped, not glued
    assert sorted(trained_keys(files)) == ["a", "b", "c", "d", "e", "x"]
    files.metrics.write_text("".join(json.dumps({"step": s, "loss": s}) + "\n" for s in (1, 2, 3, 2, 3, 4)))
    assert [r["step"] for r in read_metrics(files.metrics)] == [1, 2, 3, 4]


def _ti(try_number: int) -> SimpleNamespace:
    return SimpleNamespace(dag_id="refresh_c", run_id="manual__2026-12-01", task_id="training.train",
                           try_number=try_number)


def _operator(tmp_path, retries: int):
    from stoker_airflow.operators.train import DeepSpeedTrainOperator
    from tests.support.trainer_tools import write_plan

    run = RunLayout.of("c", "2026-12-01", root=tmp_path)
    write_manifest(run.run_dir, _manifest())
    write_plan(run.manifest)  # the train settings the task reads when it runs
    return DeepSpeedTrainOperator(task_id="train", manifest_path=str(run.manifest), retries=retries)


@pytest.mark.parametrize("try_number, retryable", [(1, True), (3, True), (4, False)])
def test_a_dead_trainer_fails_the_try_for_a_relaunch_until_the_restarts_are_spent(tmp_path, try_number, retryable):
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    op = _operator(tmp_path, retries=3)
    context = {"ti": _ti(try_number)}
    with pytest.raises(AirflowException) as e:
        op.execute_complete(context, {"status": "trainer_failed", "rc": TRAINER_LOST, "lag": 40})
    assert isinstance(e.value, AirflowFailException) is not retryable
    assert "killed as a whole" in str(e.value) and "at 40 messages of lag" in str(e.value)
    assert ("the retry relaunches it from its last checkpoint" in str(e.value)) is retryable
    assert ("no restart left (train.max_restarts = 3)" in str(e.value)) is not retryable


@pytest.mark.parametrize("status", ["timeout", "retention_expiring", "trainer_stopped_early"])
def test_what_a_relaunch_cannot_fix_fails_for_good(tmp_path, status):
    from airflow.sdk.exceptions import AirflowFailException

    with pytest.raises(AirflowFailException):
        _operator(tmp_path, retries=3).execute_complete({"ti": _ti(1)},
                                                        {"status": status, "lag": 5, "partitions": {"0": 5}})


def test_caught_up_returns_the_trainer(tmp_path, monkeypatch):
    import stoker_airflow.operators.train as ops

    monkeypatch.setattr(ops, "join_line", lambda *a: SimpleNamespace(folder=tmp_path / "night"))  # its own test
    out = _operator(tmp_path, retries=3).execute_complete({"ti": _ti(2)},
                                                          {"status": "caught_up", "rc": 0, "lag": 0})
    assert out["consumed"] is True and out["topic"] == "stoker.c.20261201.a1"
    assert out["line_night"] == str(tmp_path / "night")  # every corpus's night joins its line


def test_pruning_keeps_the_newest_complete_checkpoints_and_removes_the_rest(tmp_path):
    from stoker.layout import CHECKPOINT_COMPLETE
    from training.checkpoint import has_checkpoint, prune

    for step in (3, 6, 9, 12, 15):
        (tmp_path / f"step{step:08d}").mkdir()
        (tmp_path / f"step{step:08d}" / "model.pt").write_bytes(b"w")
    (tmp_path / "other").mkdir()  # not a checkpoint: left alone
    assert not has_checkpoint(tmp_path) and prune(tmp_path, 2) == []  # nothing complete: nothing goes
    for step in (3, 6, 9):
        (tmp_path / f"step{step:08d}" / CHECKPOINT_COMPLETE).write_text("{}")
    # 12 and 15: a killed life's tags that some rank never finished (DeepSpeed's `latest` may name one)
    (tmp_path / "latest").write_text("step00000015")
    assert prune(tmp_path, 2) == ["step00000003", "step00000012", "step00000015"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "other", "step00000006", "step00000009"]
    assert prune(tmp_path, 1) == ["step00000006"]


def test_the_consumed_counts_must_equal_the_manifests():
    from training.data.kafka_source import DataLost, verify_consumed

    m = _manifest()
    verify_consumed({"next_offsets": {"0": 100}, "consumed": {"0": 100}}, m)
    with pytest.raises(DataLost, match=r"partition 0: read 60 of 100 sequences in offsets \[0, 100\), next offset "
                                       r"100\. Records were deleted"):
        verify_consumed({"next_offsets": {"0": 100}, "consumed": {"0": 60}}, m)
    with pytest.raises(DataLost, match=r"read 100 of 100 sequences in offsets \[0, 100\), next offset 90"):
        verify_consumed({"next_offsets": {"0": 90}, "consumed": {"0": 100}}, m)


def _trainer_processes(files: TrainerFiles) -> list:
    """A running 'trainer' as the launcher leaves it: a shell in its own session (the process record),
    and a 'rank' in a session of its own that carries the trainer's tag, as torch elastic starts ranks."""
    import os
    import subprocess

    from stoker.process import TAG_VAR

    shell = files.process.spawn(["sleep", "600"], log=files.folder / "trainer.log")
    rank = subprocess.Popen(["sleep", "600"], env={**os.environ, TAG_VAR: str(files.folder)}, start_new_session=True)
    _await_tagged(str(files.folder), rank.pid)
    return [shell, rank]


def _await_tagged(tag: str, pid: int, timeout: float = 30) -> None:
    """Until the child has exec'd, /proc shows the parent's environment, without the tag."""
    import time

    from stoker.process import tagged

    deadline = time.monotonic() + timeout
    while pid not in tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pid in tagged(tag)


@pytest.mark.parametrize("event, failure", [
    ({"status": "timeout", "lag": 5, "partitions": {"0": 5}}, None),
    ({"status": "trainer_stopped_early", "lag": 5, "partitions": {"0": 5}}, None),
    ({"status": "trainer_failed", "rc": 1, "lag": 5},
     {"reason": "data_lost", "message": "partition 0: offset 3 is gone"}),
    ({"status": "trainer_failed", "rc": 1, "lag": 5}, None),  # on its last try
])
def test_a_task_that_fails_for_good_stops_its_trainer(tmp_path, event, failure):
    from airflow.sdk.exceptions import AirflowFailException

    from stoker.run.manifest import read_manifest

    op = _operator(tmp_path, retries=1)
    files = op._launcher(read_manifest(op.manifest_path)).files
    procs = _trainer_processes(files)
    if failure:
        files.failure.write_text(json.dumps(failure))
    with pytest.raises(AirflowFailException) as e:
        op.execute_complete({"ti": _ti(1 if failure else 2)}, event)
    assert [p.wait(timeout=60) for p in procs]  # both ended (by a signal), none left training
    if failure:  # the trainer's own word wins: no relaunch is offered for data that is gone
        assert "partition 0: offset 3 is gone" in str(e.value)


def test_a_checkpoint_keeps_each_stateful_part_in_its_named_slot():
    """``data`` (every rank's offsets) and ``progress`` (the run's counters) each in a slot of their own;
    a checkpoint of another format (the flat state before slots, slots without a version) or without Stoker's
    state is refused, naming the versions and what to do."""
    from stoker.exceptions import StokerError
    from training.checkpoint import client_slots, restore
    from training.progress import Progress

    data = {"topic": "t", "next_offsets": {"0": 7}}
    progress = Progress(publication="p", step=12, sequences=40, tokens=999)
    slots = client_slots({"stoker_slots": {"data": data, "progress": progress.state_dict()}, "stoker_version": 2,
                          "step": 12}, "ck")
    assert slots["data"] == data and slots["progress"]["manifest"] == "p"
    for old in ({"data": data, **progress.state_dict()}, {"stoker_slots": {"data": data}, "step": 12}):
        with pytest.raises(StokerError, match="checkpoint old is of Stoker's checkpoint format 1; this trainer reads "
                                              "format 2: remove the run's checkpoints folder"):
            client_slots(old, "old")

    class Source:
        state: dict = {}

        def load_state_dict(self, state: dict) -> None:
            self.state = state

    source, resumed = Source(), Progress(publication="p")
    restore(slots, {"data": source, "progress": resumed})
    assert source.state == data and (resumed.step, resumed.sequences, resumed.tokens) == (12, 40, 999)
    with pytest.raises(StokerError, match=r"lacks slots \['progress'\]"):
        client_slots({"stoker_slots": {"data": data}, "stoker_version": 2, "step": 1}, "ck")
    with pytest.raises(StokerError, match="holds no Stoker state"):
        client_slots({"step": 1}, "ck")
