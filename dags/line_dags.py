"""One DAG per mixture line: ``line_<name>`` for every ``corpora/lines/<name>.yaml`` (issue 35).

Publication and training are two kinds of DAG here. Each corpus of the line's mix publishes its night in its own
refresh DAG (publish only: dags/refresh_dags.py), whose publish task updates the corpus's sequences asset keyed by
the night's date. The line's DAG is scheduled on those assets' partitions, so a publication starts it for that
date; it plans the night once its corpora have published (or its deadline says to train the rest), trains the
plan's rows of every corpus's topic in one trainer, evaluates the night on every corpus's held-out documents and
lets the line's gate decide.

Wiring only: no I/O beyond reading the small YAML configs, no heavy imports at module level. A line config that
does not validate shows as this file's import error in the UI; the other lines' DAGs stay.
"""

from __future__ import annotations

import functools
import operator
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import DAG, PartitionedAssetTimetable, TaskGroup

from stoker import paths
from stoker.config.corpus import CorpusConfig, load_each
from stoker.config.line import LineConfig, load_lines
from stoker.exceptions import ConfigError
from stoker.layout import line_pool
from stoker.run.plan import line_dag, refresh_dag
from stoker_airflow.assets import KAFKA_CONN, NIGHT_DS, sequences_asset
from stoker_airflow.callbacks import stage_finished, stage_started
from stoker_airflow.operators.evaluate import NightEvalOperator
from stoker_airflow.operators.report import RunReportOperator
from stoker_airflow.operators.review import NightReviewOperator
from stoker_airflow.operators.train import DeepSpeedTrainOperator
from stoker_airflow.sensors.mix import MixPlanSensor

_PLANNED = "ti.xcom_pull(task_ids='plan')"
PLAN = "{{ " + _PLANNED + "['plan'] }}"
MANIFEST = "{{ " + _PLANNED + "['manifest'] }}"
RUN_DIR = "{{ " + _PLANNED + "['run_dir'] }}"
PLAN_POKE_S = 30
WAIT_PAST_DEADLINE_S = 24 * 3600
"""How long past its deadline a night whose line says ``when_missing: wait`` waits before its plan task fails,
naming the late corpora (a clear of the task waits again)."""

DOC = """
### Mixture line: `{name}`

{description}

**Mix**: {shares} (`when_short: {when_short}`, `max_repeats: {max_repeats}`{stratified}). Each corpus publishes its
nights in its own DAG ({publishers}); each publication starts this DAG for its date.

**Flow**: `plan` (the first run of a date claims the night; it waits until every corpus has published it, or until
`deadline.after_s` = {after_s} s after the first did, and then {when_missing}; the plan, written once, is
`.stoker/lines/{name}/mixes/<date>.json`) → `train` (DeepSpeed over every corpus's topic at once, the plan's rows
dealt so that every optimizer step follows the shares; exact across kills and resumes at another world size) →
`evaluate` (bits per byte on every corpus's held-out documents, the night against the model it continued) →
`review` (a night the gate held waits for a person) → `report`.

The night's trainer, evaluation and summary are in the run folder of its lead corpus, `{lead}`
(`stoker runs show {lead}/<date>`: the realised shares per corpus and per window of steps); its train settings
(recipe, world size, schedule) are the lead's. Nights train one at a time (pool `{pool}`).
"""


def _doc(line: LineConfig) -> str:
    m = line.mix
    what = ("trains the others at their shares scaled up" if line.deadline.when_missing == "train_rest"
            else "keeps waiting for the missing")
    return DOC.format(name=line.name, description=line.description.strip(), lead=line.lead, pool=line_pool(line.name),
                      shares=", ".join(f"{k} {v:g}" for k, v in m.shares.items()), when_short=m.when_short,
                      max_repeats=m.max_repeats, stratified=", stratified" if m.stratified else "",
                      publishers=", ".join(f"`{refresh_dag(k)}`" for k in m.shares), after_s=line.deadline.after_s,
                      when_missing=what)


def _dag_args(line: LineConfig, lead: CorpusConfig) -> dict[str, Any]:
    assets = [sequences_asset(k) for k in sorted(line.mix.shares)]
    s = lead.schedule
    return {
        "dag_id": line_dag(line.name),
        "description": f"Mixture line {line.name}: {', '.join(sorted(line.mix.shares))} → DeepSpeed, one night a date",
        # any corpus's publication of a date starts a run for it; the plan task claims the night for one of them
        "schedule": PartitionedAssetTimetable(assets=functools.reduce(operator.or_, assets)),
        "start_date": datetime.combine(s.start_date, datetime.min.time(), tzinfo=UTC),
        "catchup": False,
        "max_active_runs": s.max_active_runs,
        "default_args": {
            "retries": s.retries,
            "retry_delay": timedelta(seconds=s.retry_delay_s),
            "retry_exponential_backoff": True,
            "max_retry_delay": timedelta(hours=1),
            "on_execute_callback": stage_started,
            "on_success_callback": stage_finished,
        },
        "doc_md": _doc(line),
        "tags": ["stoker", f"line:{line.name}"],
    }


def build_line_dag(line: LineConfig, corpora: dict[str, CorpusConfig]) -> DAG:
    lead = corpora[line.lead]
    train = lead.train
    wait = line.deadline.after_s + WAIT_PAST_DEADLINE_S
    with DAG(**_dag_args(line, lead)) as dag:
        plan = MixPlanSensor(
            task_id="plan", line=line.name, ds=NIGHT_DS, mode="reschedule", poke_interval=PLAN_POKE_S,
            timeout=wait, retries=0,
            doc_md=("Claims the night for this run (another run of the same date skips, naming the claimant) and "
                    "waits until it can be planned: every corpus of the mix published the date, or the deadline "
                    "passed (deadline.when_missing). Writes the night's plan once."),
        )
        with TaskGroup("training", tooltip="DeepSpeed trains the mixture; evaluate; the gate decides"):
            trainer = DeepSpeedTrainOperator(
                task_id="train", manifest_path=MANIFEST, mix_plan_path=PLAN, kafka_config_id=KAFKA_CONN,
                inlets=[sequences_asset(k) for k in sorted(line.mix.shares)], poll_interval=2,
                retries=train.max_restarts, pool=line_pool(line.name), queue=train.queue,
                gate_task_id="training.evaluate", retry_delay=timedelta(seconds=train.restart_delay_s),
                retry_exponential_backoff=False,
                doc_md=("Launches the trainer on every corpus's topic with the night's plan and follows it, deferred, "
                        "until it exits cleanly (it checks every partition's rows against the plan first); a "
                        "trainer that dies is relaunched from its last checkpoint (the lead's train.max_restarts)."),
            )
            evaluate = NightEvalOperator(
                task_id="evaluate", manifest_path=MANIFEST, mix_plan_path=PLAN, queue=train.queue,
                doc_md=("Scores the night and the model it continued on every corpus's held-out documents (`night`: "
                        "the lead's, `night:<corpus>`: the others') and the line's earlier nights'; the gate decides."),
            )
            review = NightReviewOperator(
                task_id="review", manifest_path=MANIFEST, retries=0,
                doc_md="Only when the gate held the night: a person promotes, holds or rolls it back.",
            )
            trainer >> evaluate >> review
        # after the review, which skips when the gate did not hold the night; never in a run whose plan task
        # skipped (another run of the date trains the night): that run has no night to report
        report = RunReportOperator(task_id="report", run_dir=RUN_DIR, trigger_rule="none_failed_min_one_success",
                                   doc_md="Writes the lead run's summary.json, with the realised shares.")
        plan >> trainer
        [plan, review] >> report
    return dag


def line_errors_dag(errors: list[str]) -> DAG:
    """The line configs that do not validate, as this file's import error (as refresh_dags does for corpora)."""
    dag = DAG("stoker_line_config_errors", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=UTC),
              tags=["stoker"])

    def fail() -> None:
        raise ConfigError(f"{len(errors)} line config(s) do not validate:\n" + "\n".join(errors))
    dag.validate = fail  # type: ignore[method-assign]
    return dag


_corpora = {c.name: c for c in load_each(paths.corpora_dir())[0]}
_lines, _errors = load_lines(paths.corpora_dir(), _corpora)
for _line in _lines:
    globals()[line_dag(_line.name)] = build_line_dag(_line, _corpora)
if _errors:
    stoker_line_config_errors = line_errors_dag(_errors)
