"""``plan``: a mixture line's night is planned once its corpora have published it (issue 35).

The line's DAG is scheduled on its corpora's sequences assets, keyed by the night's date, so every corpus that
publishes a date can start a run for it. The first run to ask claims the night
(:func:`stoker.lines.mix_plan.claim_night`); the others skip, naming it. The claiming run waits, rescheduled,
until :func:`stoker.lines.mix_plan.plan_night` says the night can be planned: every corpus published, or the
line's deadline passed and ``deadline.when_missing: train_rest`` trains the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue


class MixPlanSensor(BaseSensorOperator):
    """Waits until night ``ds`` of mixture line ``line`` is planned; returns the plan's path, the lead component's
    manifest (the night's trainer, evaluation and summary live in its run folder) and the missing corpora.

    The line's config is read when the task runs, never at parse time: a re-parse cannot meet an older file.
    """

    template_fields: Sequence[str] = ("ds",)

    def __init__(self, *, line: str, ds: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.line = line
        self.ds = ds

    def _config(self) -> Any:
        from stoker import paths
        from stoker.config.line import lines_dir, load_line

        return load_line(lines_dir(paths.corpora_dir()) / f"{self.line}.yaml")

    def poke(self, context: Any) -> bool | PokeReturnValue:
        import time

        from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

        from stoker.exceptions import StokerError
        from stoker.layout import LineLayout, RunLayout
        from stoker.lines.mix_plan import claim_night, lead_of, plan_night

        try:
            line = self._config()
            owner = claim_night(self.line, self.ds, context["run_id"])
            if owner is not None:
                raise AirflowSkipException(
                    f"night {self.ds} of line {self.line} is trained by run {owner!r} of this DAG (claimed in "
                    f"{LineLayout.of(self.line).mix_claim(self.ds)}): this run, started by another corpus's "
                    "publication of the same date, has nothing to do. To train the night in this run instead, remove "
                    "that file and clear this task")
            arrivals, plan = plan_night(line, self.ds, time.time())
            if plan is not None:
                plan.read_manifests()  # a corpus re-published since the night was planned is refused, named
        except StokerError as e:
            raise AirflowFailException(str(e)) from None  # a config or a plan a retry cannot fix
        if plan is None:
            self.log.info("night %s of line %s: %s", self.ds, self.line, arrivals.why if arrivals else "waiting")
            return False
        lead = lead_of(line, plan)
        if plan.missing:
            self.log.warning("night %s of line %s trains without %s", self.ds, self.line, plan.missing)
        self.log.info("night %s of line %s: %s rows over %s (lead %s)", self.ds, self.line, plan.night.rows,
                      sorted(plan.manifests), lead)
        return PokeReturnValue(is_done=True, xcom_value={
            "plan": str(LineLayout.of(self.line).mix_plan(self.ds)), "lead": lead, "manifest": plan.manifests[lead],
            "run_dir": str(RunLayout.of_manifest(plan.manifests[lead]).run_dir), "missing": plan.missing})
