"""Stage timings for the run summary: each task notes its first start and last end in the run folder."""

from __future__ import annotations

from typing import Any

from stoker.layout import RunLayout
from stoker.reports.runs import record_stage
from stoker.run.plan import corpus_of


def run_ds(context: Any) -> str:
    """The run's date: the logical date, or the run_after date of a run triggered without one."""
    dag_run = context["dag_run"]
    when = context.get("logical_date") or dag_run.logical_date or dag_run.run_after
    return when.strftime("%Y-%m-%d")


def _record(context: Any, event: str) -> None:
    corpus = corpus_of(context["dag"].dag_id) or context["dag"].dag_id
    stage = context["task"].task_id.rsplit(".", 1)[-1]  # without its task group's prefix
    record_stage(RunLayout.of(corpus, run_ds(context)).run_dir, stage, event, run=context["run_id"])


def stage_started(context: Any) -> None:
    _record(context, "start")


def stage_finished(context: Any) -> None:
    _record(context, "end")
