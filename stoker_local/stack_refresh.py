"""``stoker refresh`` while the local stack is up (``make up``): the stack's scheduler runs the night, since
a ``dags test`` beside it could run the same night twice, and this terminal follows it with the same live
line. Through the stack's REST API, as the admin user:

* a night with no run yet is triggered (its logical date, the ``--param`` values as the run's conf);
* a night whose run is queued or running is followed;
* a night that ran before is cleared, so it runs again (as `Clear` in the UI; its conf stays the first
  run's, and the publish task replaces the night's publication without training it twice).

A paused DAG is unpaused first, as the UI's trigger dialog does by default. Ctrl-C marks the run failed
(Airflow stops its tasks) and stops the trainer it launched.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from stoker.exceptions import StackError
from stoker_local import services

FINISHED = ("success", "failed")


class StackApi:
    """The stack's REST API (``/api/v2``) with a token of the admin user."""

    def __init__(self, s: services.LocalStack) -> None:
        self.base = s.api_url
        self.password = services.admin_password(s)
        self._token: str | None = None

    def call(self, method: str, path: str, **kw: Any) -> Any:
        import httpx

        try:
            if self._token is None:
                r = httpx.post(f"{self.base}/auth/token", json={"username": services.ADMIN_USER,
                                                                "password": self.password}, timeout=30)
                r.raise_for_status()
                self._token = r.json()["access_token"]
            r = httpx.request(method, f"{self.base}/api/v2{path}", timeout=30,
                              headers={"Authorization": f"Bearer {self._token}"}, **kw)
        except httpx.HTTPError as e:
            raise StackError(f"the stack's API at {self.base} did not answer {method} {path} ({e}): is it up? "
                             "`stoker status`") from None
        if r.status_code >= 400:
            raise StackError(f"the stack's API answered {method} {path} with {r.status_code}: {r.text[:400]}")
        return r.json()


def start_night(api: StackApi, dag: str, ds: str, conf: dict[str, Any], say: Callable[[str], None]) -> str:
    """The run of night ``ds``: triggered, or found running, or cleared to run again; its run id."""
    now = datetime.now(UTC)
    if ds > now.date().isoformat():
        raise StackError(f"night {ds} is in the future (it is {now:%Y-%m-%d %H:%M} UTC): the scheduler runs no task "
                         "whose logical date is ahead of now, so its run would wait until then. Refresh it on "
                         "that day, or pick a night up to today with --ds")
    if api.call("GET", f"/dags/{dag}")["is_paused"]:
        api.call("PATCH", f"/dags/{dag}", json={"is_paused": False})
        say(f"{dag} was paused: unpaused, as the UI's trigger does (its schedule runs again; pause it in the UI)")
    logical = f"{ds}T00:00:00Z"
    found = api.call("GET", f"/dags/{dag}/dagRuns", params={"logical_date_gte": logical,
                                                              "logical_date_lte": f"{ds}T23:59:59Z"})["dag_runs"]
    if not found:
        run = api.call("POST", f"/dags/{dag}/dagRuns", json={"logical_date": logical, "conf": conf})
        say(f"{dag} {ds}: triggered on the stack's scheduler (run {run['dag_run_id']})")
        return str(run["dag_run_id"])
    run = found[-1]
    if run["state"] not in FINISHED:
        say(f"{dag} {ds}: already {run['state']} on the stack's scheduler (run {run['dag_run_id']}): following it")
        return str(run["dag_run_id"])
    api.call("POST", f"/dags/{dag}/dagRuns/{run['dag_run_id']}/clear", json={"dry_run": False})
    # the run may still read as finished for a moment after the clear: following it then ends at once, and a held
    # night's review step is never answered
    deadline = time.monotonic() + CLEARED_WAIT_S
    while api.call("GET", f"/dags/{dag}/dagRuns/{run['dag_run_id']}")["state"] in FINISHED:
        if time.monotonic() > deadline:
            raise StackError(f"{dag} {ds}: run {run['dag_run_id']} still reads as finished {CLEARED_WAIT_S:.0f} s "
                             "after it was cleared: is the scheduler up? (`stoker status`)")
        time.sleep(0.5)
    kept = f"; it keeps its conf {run.get('conf') or {}}, not --param" if conf else ""
    say(f"{dag} {ds}: ran before ({run['state']}), cleared to run again (run {run['dag_run_id']}){kept}")
    return str(run["dag_run_id"])


CLEARED_WAIT_S = 60.0
"""How long a cleared run may still read as finished before ``stoker refresh`` gives up following it."""
_FIRST_SEEN: dict[tuple[str, str, int], datetime] = {}
"""When this process first saw a review step's try waiting, by (DAG, run, try)."""
ANSWER_AFTER_S = 5.0
"""A review step is answered once it has waited this long (measured: an answer 0.2 s after it parked came
before its worker's exit was reported, and the scheduler failed the task)."""


def answer_review(api: StackApi, dag: str, run_id: str, choice: str, say: Callable[[str], None]) -> bool:
    """The run's review step waiting for a person (the gate held the night, the run's ``eval.review`` is ask):
    the terminal's ``--decision`` answers it through the REST API, as a person would in the UI."""
    from stoker.lines.gate import REVIEW_OPTIONS, REVIEW_TASK

    tis = api.call("GET", f"/dags/{dag}/dagRuns/{run_id}/taskInstances")["task_instances"]
    waiting = [t for t in tis if t["task_id"] == REVIEW_TASK and t["state"] == "awaiting_input"]
    if not waiting:
        return False
    # a cleared run's hitlDetails can still carry the earlier try's time: the wait counts from whichever is later,
    # that time or when this terminal first saw this try waiting
    seen = _FIRST_SEEN.setdefault((dag, run_id, int(waiting[0].get("try_number") or 0)), datetime.now(UTC))
    path = f"/dags/{dag}/dagRuns/{run_id}/taskInstances/{REVIEW_TASK}/-1/hitlDetails"
    asked = max(datetime.fromisoformat(api.call("GET", path)["created_at"].replace("Z", "+00:00")), seen)
    if (datetime.now(UTC) - asked).total_seconds() < ANSWER_AFTER_S:
        return False  # an answer right as the step parks races its worker's exit: Airflow fails the task
    label = next(k for k, v in REVIEW_OPTIONS.items() if v == choice)
    api.call("PATCH", path, json={"chosen_options": [label]})
    say(f"{dag}: the review step asked about the held night; answered {label!r} (--decision {choice})")
    return True


def follow_run(api: StackApi, dag: str, run_id: str, show: Callable[[], None], poll: float = 3.0) -> str:
    """Show the live line until the run finishes (a cleared run is queued again as the clear returns); its
    final state."""
    while True:
        state = api.call("GET", f"/dags/{dag}/dagRuns/{run_id}")["state"]
        if state in FINISHED:
            return str(state)
        show()
        time.sleep(poll)


def failed_tasks(api: StackApi, dag: str, run_id: str) -> list[str]:
    tis = api.call("GET", f"/dags/{dag}/dagRuns/{run_id}/taskInstances")["task_instances"]
    return [f"{t['task_id']} (try {t['try_number']})" for t in tis if t["state"] in ("failed", "upstream_failed")]


def stop_run(api: StackApi, dag: str, run_id: str) -> None:
    """Ctrl-C: the run is marked failed; Airflow stops what of it runs."""
    api.call("PATCH", f"/dags/{dag}/dagRuns/{run_id}", json={"state": "failed"})
