"""The review step: a person decides on a night the gate held (Airflow's human-in-the-loop).

``training.review`` runs after ``evaluate``. It is skipped unless the gate held the night. Then, with
``eval.review: ask`` (the default), it waits in Airflow's *Required actions* (the UI, or the REST API's
``hitlDetails``) for a person to choose **Promote**, **Hold** or **Roll back**, with the figures that stopped
the night in front of them; when nobody answers within ``eval.approval_timeout_s`` the scheduler takes the
default, **Hold**, and the night stays held; with ``eval.reviewers`` only those users may answer. With
``hold``, ``promote`` or ``roll-back`` it decides without asking, so a terminal never waits on a question: as the
corpus config's own policy, or as a run param (the trigger form, ``stoker refresh --decision``), which is the
triggering user's decision, recorded under their name and refused unless a named user allowed by
``eval.reviewers`` triggered the run (:func:`decided_ahead`; the publish task checks it first, before Spark).

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


def triggering_user(context: Any) -> str | None:
    """Who triggered the run: Airflow's ``triggering_user_name``; for ``dag.test()`` (``stoker refresh``, in the
    CLI's own process) the CLI's user. None for a scheduled run."""
    import getpass

    name = getattr(context.get("dag_run"), "triggering_user_name", None)
    return getpass.getuser() if name == "dag_test" else name


def decided_ahead(plan: Any, context: Any) -> tuple[str, str, bool] | None:
    """A run that decides a held night without asking: its choice, who (recorded in the line's ledger) and whether
    a person chose. None when it asks. The corpus config's own ``eval.review`` is its policy; a run param that
    changes it to promote or roll-back is the triggering user's decision, refused (:class:`ConfigError`) unless
    a named user allowed by ``eval.reviewers`` triggered the run."""
    from stoker.config.corpus import load_corpus
    from stoker.config.eval import check_decider

    review = str(plan.corpus.eval.review.value)
    if review == "ask":
        return None
    if review == load_corpus(plan.corpus_path).eval.review:
        return review, f"the corpus config's eval.review ({review}: {plan.corpus_path})", False
    if review == "hold":  # the gate's hold stands: nobody's decision
        return review, "the run's eval.review (hold)", False
    user = check_decider(plan.corpus.eval.reviewers, triggering_user(context), review)
    return review, f"{user}, by the run's eval.review ({review}) when they triggered it", True


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
        plan = read_plan(run.plan)
        return plan, read_manifest(self.manifest_path), plan.corpus.train, result

    def execute(self, context: Any) -> Any:
        from airflow.sdk.exceptions import AirflowFailException

        from stoker.exceptions import ConfigError

        plan, m, train, result = self._held()
        cfg, night = plan.corpus, f"{m.ds}.{m.corpus}"
        try:
            ahead = decided_ahead(plan, context)
        except ConfigError as e:
            raise AirflowFailException(f"night {night} stays held: {e}") from None
        if ahead is not None:
            choice, who, person = ahead
            self.apply(choice, who, train, m, context["ti"], person=person)
            return None
        if cfg.eval.reviewers:  # only they may answer (Airflow checks the respondent)
            self.assigned_users = [{"id": u, "name": u} for u in cfg.eval.reviewers]
        self.subject = f"Night {night} of line {train.line} was held by the gate: promote, hold or roll back?"
        self.body = figures_markdown(result, result["decision"], train.line, night)
        self.response_timeout = timedelta(seconds=cfg.eval.approval_timeout_s)
        self.log.info("waiting up to %d s for a person's decision on night %s (Required actions in the UI)",
                      cfg.eval.approval_timeout_s, night)
        return super().execute(context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        ret = super().execute_complete(context=context, event=event)
        plan, m, train, _ = self._held()
        choice = OPTIONS[ret["chosen_options"][0]]
        self.apply(choice, who_answered(ret, plan.corpus.eval.approval_timeout_s), train, m, context["ti"],
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
