"""The review step: a person decides on a night the gate held (Airflow's human-in-the-loop).

``training.review`` runs after ``evaluate``. It is skipped unless the gate held the night. Then, with
``eval.review: ask`` (the default), it waits in Airflow's *Required actions* (the UI, or the REST API's
``hitlDetails``) for a person to choose **Promote**, **Hold** or **Roll back**, with the figures that stopped
the night in front of them; when nobody answers within ``eval.approval_timeout_s`` the scheduler takes the
default, **Hold**, and the night stays held. With ``hold``, ``promote`` or ``roll-back`` (a run param:
``stoker refresh --decision``) it decides without asking, so a terminal never waits on a question.

A person's choice goes through :func:`stoker.lines.gate.human_decision`, as ``stoker lines decide`` does: recorded
with who and why in the night's record and model card, and refused (this step fails, the night stays held)
when it cannot apply, e.g. promoting a night after a later one continued the line, or while the line's next night
holds its training lease. The step does not hold the lease while it waits: a held night never stops the line
(the next night continues the head), so an answer that comes after the next night launched is refused, and
the held night can then only be trained again. This is the base of
Airflow's ``HITLBranchOperator`` without its branches: the outcome is the line's record, not a path of tasks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.providers.standard.operators.hitl import HITLOperator

from stoker.lines.gate import REVIEW_OPTIONS as OPTIONS


def figures_markdown(result: dict[str, Any], decision: dict[str, Any], line: str, night: str) -> str:
    """What the reviewer reads: why the gate held the night, and each figure against the blessed model's."""
    from stoker.lines.gate import eval_table

    stopped = {r["set"] for r in decision.get("regressions", [])}
    out = [f"The gate held night **{night}** of line **{line}**: {decision.get('why', '')}.", "",
           f"Rule: {decision.get('rule', '')}. Regressed: {', '.join(sorted(stopped)) or '-'}.", "",
           eval_table(result, decision).split("\n\nDecision:", 1)[0], "",
           "**Promote** makes it the line's head; **Hold** keeps the head where it is (the next night continues "
           "it); **Roll back** marks the night rolled back. Later: `stoker lines decide`."]
    return "\n".join(out)


def who_answered(event: dict[str, Any], timeout_s: int) -> str:
    """The person who answered, or that nobody did (the scheduler took the default)."""
    user = event.get("responded_by_user") or {}
    name = user.get("name") or user.get("id") if isinstance(user, dict) else str(user)
    return f"{name} (Airflow review)" if name else f"nobody within eval.approval_timeout_s ({timeout_s} s)"


class NightReviewOperator(HITLOperator):
    """Asks a person to promote, hold or roll back a night the gate held; skipped otherwise (see the module)."""

    template_fields: Sequence[str] = (*HITLOperator.template_fields, "manifest_path")

    def __init__(self, *, manifest_path: str, **kwargs: Any) -> None:
        super().__init__(subject="A night held by the gate", options=list(OPTIONS), defaults="Hold", **kwargs)
        self.manifest_path = manifest_path

    def _held(self) -> tuple[Any, Any, Any, dict[str, Any]]:
        """The plan's corpus config, the manifest, the line and the evaluation of a held night; else skip."""
        from airflow.sdk.exceptions import AirflowSkipException

        from stoker.layout import RunLayout
        from stoker.run.manifest import read_manifest
        from stoker.run.plan import read_plan

        run = RunLayout.of_manifest(self.manifest_path)
        result = json.loads(run.evaluation.read_text()) if run.evaluation.is_file() else {}
        decision = (result.get("decision") or {}).get("decision")
        if decision != "held":
            raise AirflowSkipException(f"the gate's decision: {decision or 'none (no evaluation)'}; nothing to review")
        cfg = read_plan(run.plan).corpus
        return cfg, read_manifest(self.manifest_path), cfg.train, result

    def execute(self, context: Any) -> Any:
        cfg, m, train, result = self._held()
        night = f"{m.ds}.{m.corpus}"
        if cfg.eval.review != "ask":
            self.apply(cfg.eval.review, f"the run's eval.review ({cfg.eval.review}), without asking", train, m,
                       context["ti"])
            return None
        self.subject = f"Night {night} of line {train.line} was held by the gate: promote, hold or roll back?"
        self.body = figures_markdown(result, result["decision"], train.line, night)
        self.response_timeout = timedelta(seconds=cfg.eval.approval_timeout_s)
        self.log.info("waiting up to %d s for a person's decision on night %s (Required actions in the UI)",
                      cfg.eval.approval_timeout_s, night)
        return super().execute(context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        ret = super().execute_complete(context=context, event=event)
        cfg, m, train, _ = self._held()
        choice = OPTIONS[ret["chosen_options"][0]]
        self.apply(choice, who_answered(ret, cfg.eval.approval_timeout_s), train, m, context["ti"],
                   person=bool(ret.get("responded_by_user")))
        return {"decision": choice}

    def apply(self, choice: str, who: str, train: Any, m: Any, ti: Any, person: bool = False) -> None:
        """The choice into the line; ``hold`` without a person changes nothing (the gate's hold stands). Refused
        (the step fails, the night stays held) while another night of the line holds its training lease."""
        from stoker.lines.gate import human_decision
        from stoker.lines.lease import LeaseHolder

        if choice == "hold" and not person:
            self.log.info("night %s.%s stays held (%s); the line's head stays", m.ds, m.corpus, who)
            return
        from stoker.layout import LineLayout

        me = LeaseHolder(dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id, corpus=m.corpus, ds=m.ds,
                         topic=m.topic)
        done = human_decision(LineLayout.of(train.line), m.ds, m.corpus, choice, who,
                              f"{choice} by {who} in the review step", run=me)
        self.log.info("night %s.%s of line %s: %s by %s", m.ds, m.corpus, train.line, done["decision"], who)
