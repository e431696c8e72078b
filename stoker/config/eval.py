"""The ``eval:`` block of a corpus: held-out share, the gate's floors, review and lm-eval tasks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from stoker.config.schema import fail as _fail
from stoker.config.schema import member

HOLDOUT_PER_MILLE_MAX = 100
"""At most a tenth of a night is held out."""


class Review(StrEnum):
    """``eval.review``: ask a person about a night the gate held, or decide without asking (the choices a person
    has are :data:`stoker.lines.gate.CHOICES`)."""

    ASK = "ask"
    PROMOTE = "promote"
    HOLD = "hold"
    ROLL_BACK = "roll-back"


class Ungated(StrEnum):
    """``eval.ungated``: what a night with no held-out document to score becomes (no set of its own, no earlier
    night's): ``promote`` it (the line moves on ungated, and its record says so) or ``hold`` it for a person
    (the review step asks, as for a night the gate held)."""

    PROMOTE = "promote"
    HOLD = "hold"


REVIEWS = tuple(r.value for r in Review)
"""``eval.review``'s words, in the order the trigger form offers them."""
APPROVAL_TIMEOUT_MAX_S = 30 * 86400


@dataclass(kw_only=True, slots=True)
class EvalConfig:
    holdout_per_mille: int = 0
    """Documents per thousand held out of training (chosen by the digest of their text) and kept with the
    night as its evaluation set; 0 holds none out (no evaluation: ``ungated`` decides). At most 100."""
    ungated: Ungated = Ungated.PROMOTE
    """A night with no held-out document to score it on (``holdout_per_mille`` 0, a night too small to hold one
    out, and no earlier night's set): ``promote`` (recorded as the rule's decision) or ``hold`` it for a person
    (``review``). A night is never the head without a decision."""
    max_regression: float = 0.01
    """The gate: a night that continues the line's head becomes the head only if no figure (bits per byte on
    its held-out documents, and on each earlier night's) is worse than the head's by more than
    max(``gate_k`` x the paired standard error, this many bits per byte); else it is held."""
    max_forgetting: float = 0.1
    """The floor of ``max_regression`` for the earlier nights' sets (forgetting): a night forgets a little of
    what it did not train on. Clean nights cost an earlier night's documents up to +0.075 bits per byte, sabotaged
    ones held there +0.17 or more (BENCHMARKS.md, "The gate against sabotage"). The night's own set keeps
    ``max_regression``."""
    gate_k: float = 2.0
    """Standard errors a figure may worsen by before the gate holds the night (see ``max_regression``)."""
    forgetting_nights: int = 3
    """Earlier nights of the lineage (the latest that kept held-out documents) the night is also scored on."""
    review: Review = Review.ASK
    """A night the gate held: ``ask`` a person in the Airflow UI (the ``training.review`` step offers promote,
    hold and roll back with the figures; the night stays held when nobody answers within
    ``approval_timeout_s``), or decide without asking: ``hold``, ``promote``, ``roll-back``. A run may change it
    (the trigger form's "Held night"; ``stoker refresh --decision``, which never asks)."""
    approval_timeout_s: int = 86400
    """Seconds the review step waits for a person's answer on a held night; then the night stays held."""
    reviewers: list[str] = field(default_factory=list)
    """Airflow users (their user names) who may decide a night the gate held: the review step's only
    respondents (Airflow's HITL ``assigned_users``), and the only users whose trigger may decide one ahead (the
    "Held night" param set to promote or roll-back; ``stoker refresh --decision`` is the CLI's user). Empty:
    whoever Airflow's auth manager lets answer, and any named triggering user. Never anonymous: a run that no
    named user triggered (a scheduled one) cannot promote or roll back a held night by its params; only the
    corpus config's own ``review`` can, recorded as that policy."""
    lm_eval_tasks: list[str] = field(default_factory=list)
    """lm-evaluation-harness tasks the evaluate step also runs, on the night's export and on the model it
    continued: their metrics (with standard errors) go to ``eval.json``, the model card and ``stoker runs show``.
    They inform and do not gate (a small model's task accuracy is mostly noise; the gate reads bits per byte).
    Runs offline: name tasks whose data is local, e.g. ``[stoker_cloze]`` from ``lm_eval_include``."""
    lm_eval_include: str | None = None
    """A folder of lm-eval task YAMLs added to the harness's own (``{state}``/``{project}`` expanded); a task's
    ``data_files`` are read relative to it. ``corpora/examples/lm_eval`` holds a small one, ``stoker_cloze``."""
    lm_eval_limit: int | None = None
    """At most this many documents of each lm-eval task (all when null)."""

    def __post_init__(self) -> None:
        if not 0 <= self.holdout_per_mille <= HOLDOUT_PER_MILLE_MAX:
            raise _fail("eval.holdout_per_mille", self.holdout_per_mille,
                        f"must be in [0, {HOLDOUT_PER_MILLE_MAX}] (documents per thousand held out of training)")
        if not 0 <= self.max_regression < 10:
            raise _fail("eval.max_regression", self.max_regression, "must be in [0, 10) bits per byte")
        if not 0 <= self.max_forgetting < 10:
            raise _fail("eval.max_forgetting", self.max_forgetting, "must be in [0, 10) bits per byte")
        if not 0 <= self.gate_k <= 10:
            raise _fail("eval.gate_k", self.gate_k, "must be in [0, 10] standard errors")
        if not 0 <= self.forgetting_nights <= 50:
            raise _fail("eval.forgetting_nights", self.forgetting_nights, "must be in [0, 50] nights")
        self.review = member("eval.review", self.review, Review)
        self.ungated = member("eval.ungated", self.ungated, Ungated)
        if not 1 <= self.approval_timeout_s <= APPROVAL_TIMEOUT_MAX_S:
            raise _fail("eval.approval_timeout_s", self.approval_timeout_s,
                        f"must be in [1, {APPROVAL_TIMEOUT_MAX_S}] seconds (30 days)")
        if any(not isinstance(u, str) or not u.strip() for u in self.reviewers):
            raise _fail("eval.reviewers", self.reviewers, "must be a list of Airflow user names")
        if any(not isinstance(t, str) or not t.strip() for t in self.lm_eval_tasks):
            raise _fail("eval.lm_eval_tasks", self.lm_eval_tasks, "must be a list of lm-eval task names")
        if self.lm_eval_tasks and self.holdout_per_mille == 0:
            raise _fail("eval.lm_eval_tasks", self.lm_eval_tasks, "run in the evaluate step, which runs only on "
                        "nights that held documents out: set eval.holdout_per_mille above 0 (e.g. 5)")
        if self.lm_eval_limit is not None and self.lm_eval_limit < 1:
            raise _fail("eval.lm_eval_limit", self.lm_eval_limit, "must be at least 1 document (null: all)")


def check_decider(reviewers: list[str], user: str | None, choice: str) -> str:
    """The person deciding a held night ahead (``choice``: the run's ``review`` param, promote or roll-back):
    named, and one of ``eval.reviewers`` when it lists any. Their name; :class:`ConfigError` otherwise."""
    from stoker.exceptions import ConfigError

    if not user:
        raise ConfigError(f"review {choice!r}: a held night is promoted or rolled back only by a named person, and "
                          "no user triggered this run (a scheduled run): leave review at ask or hold, and decide in "
                          "the review step or with `stoker lines decide`")
    if reviewers and user not in reviewers:
        raise ConfigError(f"review {choice!r}: user {user!r} may not decide a held night of this corpus: "
                          f"eval.reviewers is {reviewers}; add them there, or leave review at ask or hold")
    return user
