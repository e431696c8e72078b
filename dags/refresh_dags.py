"""One DAG per corpus: ``refresh_<name>`` for every ``corpora/<name>.yaml``.

Wiring only: no I/O beyond reading the small YAML configs, no heavy imports (pyspark, torch) at
module level. A corpus config that does not validate shows as this file's import error in the UI,
with a message naming the file, the field, the value and the fix; the other corpora's DAGs stay.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import DAG, Asset, Param, TaskGroup

from stoker import paths
from stoker.config.corpus import CorpusConfig, load_each
from stoker.config.line import mixed_corpora
from stoker.exceptions import ConfigError
from stoker.layout import RunLayout, line_pool
from stoker.run.plan import RUN_PARAMS, line_dag, refresh_dag
from stoker_airflow.assets import DS, KAFKA_CONN, sequences_asset
from stoker_airflow.callbacks import stage_finished, stage_started
from stoker_airflow.operators.evaluate import NightEvalOperator
from stoker_airflow.operators.publish import TokenizePublishOperator
from stoker_airflow.operators.report import RunReportOperator
from stoker_airflow.operators.review import NightReviewOperator
from stoker_airflow.operators.train import DeepSpeedTrainOperator
from stoker_airflow.sensors.kafka import KafkaLagSensor, KafkaPublishedSensor
from stoker_airflow.sensors.source import SourceReadySensor

DOC = """
### Corpus refresh: `{name}`

{description}

**Flow**: `await_source` (the drop at `{uri}` is complete) → `tokenize_publish` (Spark: validate,
normalise, dedup, tokenise, pack {seq_len}+1-token sequences, publish exactly once to a run-scoped
Kafka topic, write the manifest last) → `await_published` (the topic's committed end offsets equal
the manifest's) → `train` (DeepSpeed, {world} rank(s), recipe `{recipe}`, launched detached and
followed, deferred, until the training consumer group has consumed the run; a trainer that dies is
relaunched by the task's retry and resumes from its last checkpoint) → `await_consumed` (Kafka
confirms the group's lag is 0) → `evaluate` (bits per byte on held-out documents, the night against the model
it continued) → `review` (a night the gate held waits for a person's promote, hold or roll back) → `report`
(the run summary).

**Model line** `{line}`: each night continues the newest night of the line before it (the line's
first night starts from `{init}`); a night joins the line only when its training succeeded, and the
line's nights train one at a time (pool `{pool}`). Nights: `.stoker/lines/{line}/nights/<date>/`
(checkpoint, HF export with its model card).

Run state: `.stoker/runs/{name}/<date>/` (manifest.json, quarantine/, timings.json, summary.json).
Print a run's summary with `stoker runs show {name}/<date>`.
"""


def _params(cfg: CorpusConfig) -> dict[str, Param]:
    """The run params (``stoker.run.plan.RUN_PARAMS``) as the trigger form's fields; the publish task applies
    them to the corpus config and validates the whole (its run plan)."""
    out = {}
    for p in RUN_PARAMS:
        limits: dict[str, Any] = {"minimum": p.bounds[0], "maximum": p.bounds[1]} if p.bounds else {}
        if p.kind == "string":
            limits["minLength"] = 1
        if p.choices:
            limits["enum"] = list(p.choices)
        out[p.name] = Param(p.default(cfg), type=p.kind, title=p.title, description=p.description,
                            section=p.section, **limits)
    return out


def _assets(cfg: CorpusConfig) -> tuple[Asset, Asset, Asset]:
    """The corpus source, the run topics and the trained model, so lineage shows in the UI's Assets view.
    The topic's URI names the Kafka connection in its host part (no connection lookup at parse time).
    The source asset is named by its URI: corpora that read the same data share it (Airflow keeps one
    asset per URI and fails tasks whose inlets name an asset it deactivated)."""
    src = cfg.source.uri.split("{ds", 1)[0]
    src = (paths.expand(src) if "://" in src else "file://" + str(paths.resolve_local(src))).rstrip("/") + "/"
    model = RunLayout.of(cfg.name, "").run_dir
    return (Asset(name=src, uri=src, group="corpus"),
            sequences_asset(cfg.name),
            Asset(name=f"stoker.{cfg.name}.model", uri=f"file://{model}/", group="model"))


def _publish_group(cfg: CorpusConfig, run: RunLayout, source: Asset, topic: Asset) -> TaskGroup:
    with TaskGroup("publish", tooltip="Spark tokenise-and-publish, then check Kafka holds it all") as group:
        tokenize_publish = TokenizePublishOperator(
            task_id="tokenize_publish", corpus_path=str(paths.corpora_dir() / f"{cfg.name}.yaml"),
            ds=DS, kafka_config_id=KAFKA_CONN, aws_conn_id=cfg.source.aws_conn_id, name=f"stoker-{cfg.name}",
            inlets=[source], outlets=[topic],
            doc_md=("spark-submit spark_jobs/tokenize_publish.py: validate, normalise, dedup, tokenise, "
                    "pack and publish to a topic of this attempt; the manifest is written last, the run "
                    "plan (the corpus config with the run's params) first."),
        )
        await_published = KafkaPublishedSensor(
            task_id="await_published", manifest_path=str(run.manifest), kafka_config_id=KAFKA_CONN,
            poll_interval=2, timeout=600,
            doc_md="The topic's committed end offsets equal the manifest's (deferred to the triggerer).",
        )
        tokenize_publish >> await_published
    return group


def _training_group(cfg: CorpusConfig, run: RunLayout, topic: Asset, model: Asset) -> TaskGroup:
    with TaskGroup("training", tooltip="DeepSpeed trains on the run's topic; follow its consumer lag") as group:
        train = DeepSpeedTrainOperator(
            # what shapes the task only: the rest of train.* (world size, launcher, nodes, timeout, the keys
            # audit, the recipe) is read from the run's plan when the task runs
            task_id="train", manifest_path=str(run.manifest), kafka_config_id=KAFKA_CONN, inlets=[topic],
            poll_interval=2, retries=cfg.train.max_restarts, pool=line_pool(cfg.train.line), queue=cfg.train.queue,
            gate_task_id="training.evaluate", retry_delay=timedelta(seconds=cfg.train.restart_delay_s),
            retry_exponential_backoff=False,
            doc_md=("Launches the trainer detached (torchrun) and follows it, deferred, until it has consumed "
                    "the run (progress as % of the run's tokens). A trainer that dies fails this try within "
                    "one poll (2 s), or once its heartbeat is stale when it ran on another host; the retry "
                    "relaunches it from its last checkpoint (train.max_restarts)."),
        )
        await_consumed = KafkaLagSensor(
            task_id="await_consumed", manifest_path=str(run.manifest), follow_trainer=True, max_lag=0,
            kafka_config_id=KAFKA_CONN, poll_interval=5, timeout=cfg.train.timeout_s, outlets=[model],
            doc_md="Confirms from Kafka that the training group's lag is 0 and the trainer exited cleanly.",
        )
        evaluate = NightEvalOperator(
            task_id="evaluate", manifest_path=str(run.manifest), queue=cfg.train.queue,
            doc_md=("Scores the night's model and the model it continued on the night's held-out documents "
                    "and on the line's earlier nights' (forgetting): bits per byte per source, with standard "
                    "errors (eval.json), and the decision in the line. A night with no held-out document to "
                    "score is decided by eval.ungated (promote, by default)."),
        )
        review = NightReviewOperator(
            task_id="review", manifest_path=str(run.manifest), retries=0,
            doc_md=("Only when the gate held the night: a person promotes, holds or rolls it back (Required "
                    "actions), seeing the figures; Hold when nobody answers within eval.approval_timeout_s. "
                    "With eval.review (a run param) hold, promote or roll-back it decides without asking."),
        )
        train >> await_consumed >> evaluate >> review
    return group


def _dag_args(cfg: CorpusConfig) -> dict[str, Any]:
    s = cfg.schedule
    return {
        "dag_id": refresh_dag(cfg.name),
        "description": f"Refresh of corpus {cfg.name}: source → Spark → Kafka → DeepSpeed",
        "schedule": s.cron,
        "start_date": datetime.combine(s.start_date, datetime.min.time(), tzinfo=UTC),
        "catchup": s.catchup,
        "max_active_runs": s.max_active_runs,
        "default_args": {
            "retries": s.retries,
            "retry_delay": timedelta(seconds=s.retry_delay_s),
            "retry_exponential_backoff": True,
            "max_retry_delay": timedelta(hours=1),
            "on_execute_callback": stage_started,
            "on_success_callback": stage_finished,
        },
        "params": _params(cfg),
        "doc_md": DOC.format(name=cfg.name, description=cfg.description.strip(), uri=cfg.source.uri,
                             seq_len=cfg.pack.seq_len, world=cfg.train.world_size, recipe=cfg.train.recipe,
                             line=cfg.train.line, init=cfg.train.init, pool=line_pool(cfg.train.line)),
        "tags": ["stoker", f"corpus:{cfg.name}"],
    }


PUBLISH_ONLY = """
**Publish only**: this corpus is a component of mixture line `{line}` (`corpora/lines/{line}.yaml`). Its nights
are trained by that line's DAG, `{dag}`, which the publish task's asset event (keyed by the night's date) starts;
this DAG trains nothing itself.
"""


def build_dag(cfg: CorpusConfig, mixed_in: str | None = None) -> DAG:
    """``mixed_in``: the mixture line whose DAG trains this corpus's nights; the refresh then only publishes."""
    run = RunLayout.of(cfg.name, DS)  # paths are templates: the date is the run's
    source_asset, topic_asset, model_asset = _assets(cfg)
    args = _dag_args(cfg)
    if mixed_in:
        args["doc_md"] += PUBLISH_ONLY.format(line=mixed_in, dag=line_dag(mixed_in))
        args["description"] = f"Publication of corpus {cfg.name} for mixture line {mixed_in}: source → Spark → Kafka"
        args["tags"] = [*args["tags"], f"line:{mixed_in}"]
    with DAG(**args) as dag:
        await_source = SourceReadySensor(
            task_id="await_source", uri="{{ params.source_uri }}", ds=DS,
            success_marker=cfg.source.success_marker, aws_conn_id=cfg.source.aws_conn_id,
            webhdfs_url=cfg.source.webhdfs_url, corpus_uri=cfg.source.uri,
            allowed_uri_prefixes=cfg.source.allowed_uri_prefixes, poke_interval=cfg.source.poke_interval_s,
            timeout=cfg.source.timeout_s, mode="reschedule", inlets=[source_asset],
            doc_md="Waits until the night's drop is complete (its success marker is present).",
        )
        publish = _publish_group(cfg, run, source_asset, topic_asset)
        report = RunReportOperator(task_id="report", run_dir=str(run.run_dir), trigger_rule="none_failed",
                                   doc_md=("Writes summary.json; links to the run summary and the loss curve. "
                                           "Runs too when training was skipped (a night with no usable "
                                           "document) and says why."))
        if mixed_in:
            await_source >> publish >> report
        else:
            await_source >> publish >> _training_group(cfg, run, topic_asset, model_asset) >> report
    return dag


def config_errors_dag(errors: list[str]) -> DAG:
    """The corpus configs that do not validate, as a DAG that fails Airflow's validation: the DAG
    processor lists the messages (file, field, value, fix) as this file's import error, and keeps
    every other corpus's DAG."""
    dag = DAG("stoker_corpus_config_errors", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=UTC),
              tags=["stoker"])

    def fail() -> None:
        raise ConfigError(f"{len(errors)} corpus config(s) do not validate:\n" + "\n".join(errors))
    dag.validate = fail  # type: ignore[method-assign]
    return dag


def recipe_error(cfg: CorpusConfig) -> str | None:
    """The corpus's ``train.recipe`` must be a built-in or a valid ``corpora/recipes/<name>.yaml``."""
    from stoker.config.recipes import get_recipe

    try:
        get_recipe(cfg.train.recipe)
    except ConfigError as e:
        return f"{paths.corpora_dir() / (cfg.name + '.yaml')}: {e}"
    return None


_configs, _errors = load_each(paths.corpora_dir())
_mixed = mixed_corpora(paths.corpora_dir())  # their nights train in their line's DAG (dags/line_dags.py)
for _cfg in _configs:
    _bad_recipe = recipe_error(_cfg)
    if _bad_recipe:
        _errors.append(_bad_recipe)
    else:
        globals()[refresh_dag(_cfg.name)] = build_dag(_cfg, _mixed.get(_cfg.name))
if _errors:
    stoker_corpus_config_errors = config_errors_dag(_errors)
