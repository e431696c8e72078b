"""One DAG per corpus: ``refresh_<name>`` for every ``corpora/<name>.yaml``.

Wiring only: no I/O beyond reading the small YAML configs, no heavy imports (pyspark, torch) at
module level. A corpus config that does not validate fails here, at parse time, with a message
naming the field, the value and the fix.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG, Param, task

from stoker import paths
from stoker.config import CorpusConfig, load_all
from stoker_airflow.callbacks import stage_finished, stage_started
from stoker_airflow.operators import DeepSpeedTrainOperator, TokenizePublishOperator
from stoker_airflow.sensors import KafkaLagSensor, KafkaPublishedSensor, SourceReadySensor

# The run's date: the logical date, or the run_after date of a run triggered without one.
_WHEN = "(logical_date or dag_run.run_after)"
DS = "{{ " + _WHEN + ".strftime('%Y-%m-%d') }}"
DS_NODASH = "{{ " + _WHEN + ".strftime('%Y%m%d') }}"
SOURCE_URI = ("{{ params.source_uri | replace('{ds}', " + _WHEN + ".strftime('%Y-%m-%d'))"
              " | replace('{ds_nodash}', " + _WHEN + ".strftime('%Y%m%d')) }}")

DOC = """
### Corpus refresh: `{name}`

{description}

**Flow**: `await_source` (the drop at `{uri}` is complete) → `tokenize_publish` (Spark: validate,
normalise, dedup, tokenise, pack {seq_len}+1-token sequences, publish exactly once to a run-scoped
Kafka topic, write the manifest last) → `await_published` (the topic's committed end offsets equal
the manifest's) → `train` (DeepSpeed, {world} rank(s), recipe `{recipe}`, launched detached; reads
the topic, resumes from its last checkpoint) → `await_consumed` (deferred: the training consumer group's
lag reaches 0, progress logged as % of the run's tokens) → `report` (the run summary).

Run state: `.stoker/runs/{name}/<date>/` (manifest.json, quarantine/, timings.json, summary.json).
Print a run's summary with `stoker runs show {name}/<date>`.
"""


def _params(cfg: CorpusConfig) -> dict[str, Param]:
    return {
        "source_uri": Param(cfg.source.uri, type="string", minLength=1,
                            description="Where this run reads raw text ({ds} selects the night)."),
        "seq_len": Param(cfg.pack.seq_len, type="integer", minimum=2, maximum=1_048_576,
                         description="Tokens per packed training sequence (each record holds seq_len+1)."),
        "spark_partitions": Param(cfg.publish.spark_partitions, type="integer", minimum=1, maximum=100_000,
                                  description="Spark tasks that pack and publish (one Kafka transaction each)."),
    }


def build_dag(cfg: CorpusConfig) -> DAG:
    run_dir = f"{paths.runs_dir()}/{cfg.name}/{DS}"
    s = cfg.schedule
    default_args = {
        "retries": s.retries,
        "retry_delay": timedelta(seconds=s.retry_delay_s),
        "retry_exponential_backoff": True,
        "max_retry_delay": timedelta(hours=1),
        "on_execute_callback": stage_started,
        "on_success_callback": stage_finished,
    }
    with DAG(
        dag_id=f"refresh_{cfg.name}",
        description=f"Refresh of corpus {cfg.name}: source → Spark → Kafka",
        schedule=s.cron,
        start_date=datetime.combine(s.start_date, datetime.min.time(), tzinfo=UTC),
        catchup=s.catchup,
        max_active_runs=s.max_active_runs,
        default_args=default_args,
        params=_params(cfg),
        doc_md=DOC.format(name=cfg.name, description=cfg.description.strip(), uri=cfg.source.uri,
                          seq_len=cfg.pack.seq_len, world=cfg.train.world_size, recipe=cfg.train.recipe),
        tags=["stoker", f"corpus:{cfg.name}"],
    ) as dag:
        await_source = SourceReadySensor(
            task_id="await_source", uri=SOURCE_URI,
            success_marker=cfg.source.success_marker, poke_interval=cfg.source.poke_interval_s,
            timeout=cfg.source.timeout_s, mode="reschedule",
        )
        publish = TokenizePublishOperator(
            task_id="tokenize_publish",
            corpus_path=str(paths.corpora_dir() / f"{cfg.name}.yaml"),
            ds=DS, topic=f"stoker.{cfg.name}.{DS_NODASH}.a{{{{ ti.try_number }}}}", run_dir=run_dir,
            extra_args=["--source-uri", "{{ params.source_uri }}", "--seq-len", "{{ params.seq_len }}",
                        "--spark-partitions", "{{ params.spark_partitions }}"],
            name=f"stoker-{cfg.name}",
        )
        await_published = KafkaPublishedSensor(
            task_id="await_published", manifest_path=f"{run_dir}/manifest.json", poll_interval=2, timeout=600,
        )

        train = DeepSpeedTrainOperator(
            task_id="train", manifest_path=f"{run_dir}/manifest.json", out_dir=f"{run_dir}/train",
            recipe=cfg.train.recipe, world_size=cfg.train.world_size,
        )
        await_consumed = KafkaLagSensor(
            task_id="await_consumed", manifest_path=f"{run_dir}/manifest.json", trainer_dir=f"{run_dir}/train",
            max_lag=0, poll_interval=5, timeout=cfg.train.timeout_s,
        )

        @task(task_id="report")
        def report(run_dir: str) -> dict:
            """Write summary.json next to the manifest and log the run summary."""
            from pathlib import Path

            from stoker.manifest import atomic_write_json
            from stoker.runs import render, summary

            s = summary(Path(run_dir))
            atomic_write_json(Path(run_dir) / "summary.json", s)
            print(render(s))
            return {k: s[k] for k in ("run_id", "topic", "docs_in", "docs_kept", "tokens", "sequences")}

        await_source >> publish >> await_published >> train >> await_consumed >> report(run_dir)
    return dag


for _cfg in load_all(paths.corpora_dir()):
    globals()[f"refresh_{_cfg.name}"] = build_dag(_cfg)
