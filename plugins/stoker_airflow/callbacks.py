"""Stage timings for the run summary: each task notes its first start and last end in the run folder."""

from __future__ import annotations

from typing import Any

from stoker.layout import RunLayout
from stoker.reports.runs import record_stage
from stoker.run.plan import corpus_of, line_of


def run_ds(context: Any) -> str:
    """The run's date: the partition key of a run an asset event started (a line's DAG: the night's date), the
    logical date, or the run_after date of a run triggered without one."""
    dag_run = context["dag_run"]
    key = getattr(dag_run, "partition_key", None)
    if key:
        return str(key)
    when = context.get("logical_date") or dag_run.logical_date or dag_run.run_after
    return when.strftime("%Y-%m-%d")


def _record(context: Any, event: str) -> None:
    dag_id, ds = context["dag"].dag_id, run_ds(context)
    line = line_of(dag_id)
    if line is not None:  # a mixture line's night is recorded in its lead's run, known once it is planned
        from stoker.lines.mix_plan import planned_lead

        corpus = planned_lead(line, ds)
        if corpus is None:
            return
    else:
        corpus = corpus_of(dag_id) or dag_id
    stage = context["task"].task_id.rsplit(".", 1)[-1]  # without its task group's prefix
    record_stage(RunLayout.of(corpus, ds).run_dir, stage, event, run=context["run_id"])


def stage_started(context: Any) -> None:
    _record(context, "start")


def stage_finished(context: Any) -> None:
    _record(context, "end")
