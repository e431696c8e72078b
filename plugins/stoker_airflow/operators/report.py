"""The report task and the run page's links: the run summary, the loss curve, the assets' metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator, BaseOperatorLink


def _annotate_outlets(task: BaseOperator, context: Any, run_dir: Path, partition: str | None = None) -> None:
    """Attach the run's topic and counts to the asset events of this task's outlets (lineage in the UI), and the
    night's date as the events' partition key when ``partition`` is given (the publish task: a consumer scheduled on
    several corpora's sequences assets, a mixture line, matches their nights by it)."""
    from stoker.layout import RunLayout
    from stoker.reports.runs import summary

    try:
        s = summary(run_dir)
    except Exception:  # noqa: BLE001 - lineage is best effort; the manifest check is the sensor's job
        return
    extra = {"run_dir": str(run_dir), "run_id": s["run_id"], "manifest": str(RunLayout(run_dir).manifest),
             "topic": s["topic"], "sequences": s["sequences"], "tokens": s["tokens"], "source_uri": s["source_uri"]}
    if s.get("training"):
        extra.update({k: s["training"][k] for k in ("export", "sequences_consumed", "last_loss")})
    for outlet in task.outlets:
        context["outlet_events"][outlet].extra = extra
        if partition:
            context["outlet_events"][outlet].add_partitions(partition)


def _ui_base() -> str:
    from airflow.configuration import conf

    return conf.get("api", "base_url", fallback="").rstrip("/")


class RunSummaryLink(BaseOperatorLink):
    """The run summary page the Stoker plugin serves (counts, timings, training, loss curve)."""

    name = "Run summary"

    def get_link(self, operator: BaseOperator, *, ti_key: Any) -> str:
        return f"{_ui_base()}/stoker/dag-runs/{ti_key.dag_id}/{ti_key.run_id}"


class LossCurveLink(BaseOperatorLink):
    name = "Loss curve"

    def get_link(self, operator: BaseOperator, *, ti_key: Any) -> str:
        return f"{_ui_base()}/stoker/dag-runs/{ti_key.dag_id}/{ti_key.run_id}/loss.png"


class RunReportOperator(BaseOperator):
    """Write ``summary.json`` next to the manifest, log the run summary, link to it from the UI."""

    template_fields: Sequence[str] = ("run_dir",)
    operator_extra_links = (RunSummaryLink(), LossCurveLink())

    def __init__(self, *, run_dir: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_dir = run_dir

    def execute(self, context: Any) -> dict[str, Any]:
        from stoker.files import atomic_write_json
        from stoker.layout import RunLayout
        from stoker.reports.runs import render, summary

        s = summary(Path(self.run_dir))
        atomic_write_json(RunLayout(Path(self.run_dir)).summary, s)
        self.log.info("run summary:\n%s", render(s))
        _annotate_outlets(self, context, Path(self.run_dir))
        return {k: s[k] for k in ("run_id", "topic", "docs_in", "docs_kept", "tokens", "sequences")}
