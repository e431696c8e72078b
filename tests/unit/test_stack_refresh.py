"""`stoker refresh` while the stack is up: which REST calls start the night (the calls themselves run
against the real stack in tests/stack/test_operations.py::test_cli_backfill_two_nights_then_rerun_one)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from stoker.exceptions import StackError
from stoker_local.stack_refresh import start_night

pytestmark = pytest.mark.unit


class Api:
    """The stack's answers, recorded: a night's runs and the DAG's pause flag."""

    def __init__(self, runs: list[dict[str, Any]], paused: bool = False) -> None:
        self.runs, self.paused, self.calls = runs, paused, []
        self.stale_reads = 0
        """Reads of a cleared run that still answer its old state (the scheduler has not queued it yet)."""

    def call(self, method: str, path: str, **kw: Any) -> Any:
        self.calls.append((method, path, kw.get("json")))
        if path.endswith("/dagRuns") and method == "GET":
            return {"dag_runs": self.runs}
        if path.endswith("/dagRuns"):
            return {"dag_run_id": "manual__new", **kw["json"]}
        if path.endswith("/clear"):
            self.stale_reads = 2
            return {}
        if "/dagRuns/" in path and method == "GET":
            run = next(r for r in self.runs if path.endswith(r["dag_run_id"]))
            if self.stale_reads:
                self.stale_reads -= 1
                return run
            return {**run, "state": "queued"}
        return {"is_paused": self.paused}


def test_a_night_without_a_run_is_triggered_with_its_params_and_a_paused_dag_unpaused():
    api, said = Api([], paused=True), []
    assert start_night(api, "refresh_web", "2026-12-03", {"seq_len": 128}, said.append) == "manual__new"
    assert ("PATCH", "/dags/refresh_web", {"is_paused": False}) in api.calls
    assert ("POST", "/dags/refresh_web/dagRuns", {"logical_date": "2026-12-03T00:00:00Z",
                                                   "conf": {"seq_len": 128}}) in api.calls
    assert "unpaused" in said[0] and "triggered" in said[1]


def test_a_running_night_is_followed_and_a_finished_one_cleared_to_run_again():
    api, said = Api([{"dag_run_id": "scheduled__x", "state": "running"}]), []
    assert start_night(api, "refresh_web", "2026-12-03", {}, said.append) == "scheduled__x"
    assert not [c for c in api.calls if c[0] == "POST"] and "following it" in said[-1]
    api = Api([{"dag_run_id": "backfill__y", "state": "failed", "conf": {}}])
    assert start_night(api, "refresh_web", "2026-12-03", {"seq_len": 64}, said.append) == "backfill__y"
    assert ("POST", "/dags/refresh_web/dagRuns/backfill__y/clear", {"dry_run": False}) in api.calls
    assert "cleared to run again" in said[-1] and "not --param" in said[-1]  # a cleared run keeps its conf
    # the cleared run read as failed for a moment: followed from there, `stoker refresh` ended at once and never
    # answered the night's review step; it waits until the scheduler has queued the run
    reads = [c for c in api.calls if c[:2] == ("GET", "/dags/refresh_web/dagRuns/backfill__y")]
    assert len(reads) == 3 and api.stale_reads == 0


def test_a_night_in_the_future_is_refused_before_anything_is_triggered():
    """Airflow runs no task whose logical date is ahead of now (its "Logical date is in the future" dependency):
    such a run would sit queued with no task started until that day, so it is refused, naming the night."""
    tomorrow = (datetime.now(UTC).date() + timedelta(days=1)).isoformat()
    api = Api([])
    with pytest.raises(StackError, match=f"night {tomorrow} is in the future.*--ds"):
        start_night(api, "refresh_web", tomorrow, {}, print)
    assert api.calls == []
    today = datetime.now(UTC).date().isoformat()  # today's night starts at 00:00, in the past: triggered
    assert start_night(api, "refresh_web", today, {}, print) == "manual__new"


def test_a_cleared_runs_review_is_answered_only_once_this_try_has_waited(monkeypatch):
    """After a clear, hitlDetails can still carry the earlier try's time: answering at once raced the step's
    parking and Airflow failed the task (seen in a fresh-clone run of the stack's review test). The wait counts
    from when the terminal first saw this try waiting too."""
    from datetime import UTC, datetime, timedelta

    from stoker_local import stack_refresh

    class Review:
        calls: list = []

        def call(self, method: str, path: str, **kw: Any) -> Any:
            self.calls.append((method, path))
            if path.endswith("/taskInstances"):
                return {"task_instances": [{"task_id": "training.review", "state": "awaiting_input", "try_number": 2}]}
            if path.endswith("/hitlDetails") and method == "GET":  # the earlier try's question, an hour ago
                return {"created_at": (datetime.now(UTC) - timedelta(hours=1)).isoformat()}
            return {}

    api, said = Review(), []
    assert not stack_refresh.answer_review(api, "refresh_g", "manual__1", "hold", said.append)  # just seen
    assert not [c for c in api.calls if c[0] == "PATCH"]
    monkeypatch.setattr(stack_refresh, "ANSWER_AFTER_S", 0.0)
    assert stack_refresh.answer_review(api, "refresh_g", "manual__1", "hold", said.append)
    assert "answered 'Hold' (--decision hold)" in said[-1]
