"""Operators of a refresh."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator, BaseOperatorLink

from stoker import paths
from stoker.config import NODE_SHELL
from stoker.lines import LineSettings
from stoker_airflow.hooks import StokerKafkaHook
from stoker_airflow.launcher import LOCAL_HOSTS, Placement
from stoker_airflow.lines import (
    check_before_publish,
    give_back_line_lease,
    hand_line_lease_to,
    init_args,
    join_line,
    keep_replay_store,
    launch_parent,
    prepare_replay,
    take_line_lease,
    trainer_args,
)
from stoker_airflow.triggers import Status

SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",  # the job logs its own progress lines
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.adaptive.enabled": "true",
    "spark.task.maxFailures": "4",
    "spark.executorEnv.TOKENIZERS_PARALLELISM": "false",
}


SECRETS_FILE = "stoker-secrets.json"
"""What :meth:`TokenizePublishOperator.hand_over` ships to YARN and Kubernetes jobs (``--files``)."""


def default_spark_conf(ram_bytes: int | None = None) -> dict[str, str]:
    """Stoker's Spark settings, sized from this machine: the JVM gets an eighth of the memory, between
    1 and 2 GiB. Records stream in bounded batches and persisted data spills to disk, so the heap
    never has to hold a file; what it holds is shuffle and cache buffers. A corpus overrides any of
    them with ``publish.spark_conf``."""
    import os

    ram = ram_bytes or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    gib = max(1, min(2, ram // (8 << 30)))
    return {**SPARK_CONF, "spark.driver.memory": f"{gib}g", "spark.executor.memory": f"{gib}g"}


class TokenizePublishOperator(SparkSubmitOperator):
    """``spark-submit spark_jobs/tokenize_publish.py`` through ``spark_default`` (any master).

    The run's folder and its topic come from the run layout (:mod:`stoker.layout`): one topic per
    try of this task, so a retry never mixes with what an earlier attempt left. Once the job has
    written the manifest, this task deletes the topics of the run's other attempts.

    The Kafka client config is read from ``kafka_config_id`` here and handed to the job in the
    environment (``STOKER_KAFKA_CONFIG``), so secrets never appear on a command line. So are an
    s3:// source's endpoint and credentials (the ``aws_conn_id`` connection, else this process's AWS
    environment, as ``AWS_*`` variables), and the S3A connector's jars go on ``--jars``.
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "corpus_path", "ds", "extra_args")

    def __init__(self, *, corpus_path: str, ds: str, kafka_config_id: str = "kafka_default",
                 aws_conn_id: str = "aws_default", extra_args: list[str] | None = None, **kwargs: Any) -> None:
        if not Path(corpus_path).is_file():
            raise ValueError(f"corpus_path = {corpus_path!r}: no such corpus config")
        kwargs.setdefault("application", str(paths.project_root() / "spark_jobs" / "tokenize_publish.py"))
        kwargs.setdefault("conf", default_spark_conf())
        super().__init__(**kwargs)
        self.corpus_path = corpus_path
        self.ds = ds
        self.kafka_config_id = kafka_config_id
        self.aws_conn_id = aws_conn_id
        self.extra_args = list(extra_args or [])

    def plan(self, context: Any) -> Any:
        """The run plan: the corpus config with this run's params, the night's line parent, validated once
        and written next to the manifest before Spark runs. A bad param fails the task for good (a retry
        cannot fix it), naming the param, the value and the limit."""
        from airflow.sdk.exceptions import AirflowFailException

        from stoker.exceptions import ConfigError
        from stoker.plan import RUN_PARAMS, plan_run

        given = context.get("params") or {}
        params = {p.name: given[p.name] for p in RUN_PARAMS if p.name in given}
        try:
            plan = plan_run(self.corpus_path, self.ds, params, attempt=context["ti"].try_number)
        except ConfigError as e:
            raise AirflowFailException(str(e)) from None
        plan.parent = check_before_publish(plan.corpus, self.ds).to_dict()  # before any data moves
        plan.write()
        return plan

    def execute(self, context: Any) -> None:
        plan = self.plan(context)
        cfg, run, topic = plan.corpus, plan.run, plan.topic
        self.conf = {**(self.conf or {}), **cfg.publish.spark_conf}
        self.application_args = ["--plan", str(run.plan), *self.extra_args]
        hook = StokerKafkaHook(self.kafka_config_id)
        self.env_vars = {**(self.env_vars or {}), "PYSPARK_PYTHON": sys.executable,
                         "PYSPARK_DRIVER_PYTHON": sys.executable}
        secrets = {"STOKER_KAFKA_CONFIG": json.dumps(hook.subprocess_config())}
        from stoker.sources import uses_s3

        if uses_s3(cfg):  # the source or the near-dedup index
            from stoker.connectors import s3a_jars
            from stoker_airflow.hooks import s3_settings

            # complete: the connection's settings replace this worker's own AWS_* environment, never mix
            secrets.update(s3_settings(self.aws_conn_id).to_env(complete=True))
            self.jars = ",".join([*(self.jars.split(",") if self.jars else []), *map(str, s3a_jars())])
        folder = self.hand_over(secrets)
        try:
            super().execute(context)
        finally:
            if folder is not None:
                import shutil

                shutil.rmtree(folder, ignore_errors=True)
        self._drop_earlier_attempts(hook.client_config(), topic)
        _annotate_outlets(self, context, run.run_dir)

    def hand_over(self, secrets: dict[str, str]) -> Path | None:
        """Give the job its secrets (Kafka client config, S3 credentials) without a command line.

        Local and standalone masters: in spark-submit's environment. YARN and Kubernetes: the
        provider's hook turns ``env_vars`` into ``--conf spark.yarn.appMasterEnv.*`` /
        ``spark.kubernetes.driverEnv.*`` arguments, visible in any process listing, so they go in a
        file only this user can read, shipped by Spark's ``--files`` (YARN puts it in the driver's
        and executors' working folders) and named by ``--secrets-file``; the folder is removed
        after the submit (returned). Enable ``spark.authenticate`` and ``spark.network.crypto.enabled``
        on such clusters: the job hands the settings to its tasks."""
        import tempfile

        from airflow.sdk import BaseHook

        from stoker.paths import write_private

        master = str(BaseHook.get_connection(self._conn_id).host or "")
        if "yarn" not in master and "k8s" not in master:
            self.env_vars = {**(self.env_vars or {}), **secrets}
            return None
        folder = Path(tempfile.mkdtemp(prefix="stoker-secrets-"))  # 0700
        write_private(folder / SECRETS_FILE, json.dumps(secrets))
        self.files = ",".join([*(self.files.split(",") if self.files else []), str(folder / SECRETS_FILE)])
        # client mode: the driver reads it where it is; cluster mode: the same name in its working folder
        self.application_args = [*(self.application_args or []), "--secrets-file", str(folder / SECRETS_FILE)]
        return folder

    def _drop_earlier_attempts(self, config: dict[str, Any], topic: str) -> None:
        """The manifest names ``topic`` now: the run's other attempts' topics and the task log are garbage."""
        from stoker import kafka as skafka
        from stoker.layout import earlier_attempts, run_of_topic

        stale = earlier_attempts(topic, skafka.list_topics(config, run_of_topic(topic)))
        self.log.info("deleting topics of earlier attempts and the task log: %s", stale)
        skafka.delete_topics(config, stale)


def _annotate_outlets(task: BaseOperator, context: Any, run_dir: Path) -> None:
    """Attach the run's topic and counts to the asset events of this task's outlets (lineage in the UI)."""
    from stoker.runs import summary

    try:
        s = summary(run_dir)
    except Exception:  # noqa: BLE001 - lineage is best effort; the manifest check is the sensor's job
        return
    extra = {"run_dir": str(run_dir), "topic": s["topic"], "sequences": s["sequences"], "tokens": s["tokens"],
             "source_uri": s["source_uri"]}
    if s.get("training"):
        extra.update({k: s["training"][k] for k in ("export", "sequences_consumed", "last_loss")})
    for outlet in task.outlets:
        context["outlet_events"][outlet].extra = extra


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
        from stoker.layout import RunLayout
        from stoker.manifest import atomic_write_json
        from stoker.runs import render, summary

        s = summary(Path(self.run_dir))
        atomic_write_json(RunLayout(Path(self.run_dir)).summary, s)
        self.log.info("run summary:\n%s", render(s))
        _annotate_outlets(self, context, Path(self.run_dir))
        return {k: s[k] for k in ("run_id", "topic", "docs_in", "docs_kept", "tokens", "sequences")}


def _read_failure(path: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


class DeepSpeedTrainOperator(BaseOperator):
    """Launches the trainer on the run's topic, detached, and follows it to the end, deferred: a
    training run can take hours and must not hold a worker slot.

    The launcher (``torchrun``, or ``deepspeed`` with a hostfile for several nodes) runs in a session
    of its own with its log, process record and exit code in the run's trainer folder. While deferred,
    the triggerer polls the training group's lag and the trainer's liveness: the task succeeds when
    the trainer has consumed the run and exited cleanly. A trainer that dies, however it dies (a
    failed rank, the whole process group killed, the OOM killer), fails this try within one poll
    interval, and Airflow's retry (``retries``: the corpus's ``train.max_restarts``) relaunches it from
    its latest checkpoint, whose Kafka offsets make the resume exact. A retry while a trainer still
    runs adopts it instead of starting a second one on the same checkpoint folder.
    """

    template_fields: Sequence[str] = ("manifest_path",)

    def __init__(self, *, manifest_path: str, recipe: str = "debug_cpu", world_size: int = 1,
                 launcher: str = "torchrun", kafka_config_id: str = "kafka_default",
                 extra_args: list[str] | None = None, poll_interval: float = 5.0, timeout_s: float = 24 * 3600,
                 log_keys: bool = False, line: dict[str, Any] | None = None, nodes: list[str] | None = None,
                 node_shell: str = NODE_SHELL, gate_task_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gate_task_id = gate_task_id
        """The task of this run that decides whether the joined night is the line's head: the lease goes to it."""
        if world_size < 1:
            raise ValueError(f"world_size = {world_size}: must be >= 1")
        if launcher not in ("torchrun", "deepspeed"):
            raise ValueError(f"launcher = {launcher!r}: must be 'torchrun' or 'deepspeed'")
        self.manifest_path = manifest_path
        self.recipe = recipe
        self.world_size = world_size
        self.launcher = launcher
        self.kafka_config_id = kafka_config_id
        self.extra_args = list(extra_args or [])
        self.poll_interval = poll_interval
        self.timeout_s = timeout_s
        self.log_keys = log_keys
        self.line = dict(line) if line else None
        self.nodes = list(nodes or [])
        self.node_shell = node_shell
        if self.nodes and world_size % len(self.nodes):
            raise ValueError(f"world_size = {world_size}: must be a multiple of the {len(self.nodes)} nodes")
        """The model line (``LineSettings``) the night continues; None: a model of its own."""

    def line_settings(self) -> LineSettings | None:
        """The model line the night continues: the corpus's, from the run plan the publish task wrote (the
        ``line`` argument, where given, wins: a trainer run outside a refresh DAG)."""
        from stoker.layout import RunLayout
        from stoker.plan import read_plan

        if self.line:
            return LineSettings(**self.line)
        plan = RunLayout.of_manifest(self.manifest_path).plan
        return LineSettings.of(read_plan(plan).corpus.train) if plan.is_file() else None

    def _placement(self) -> Placement:
        return Placement(world_size=self.world_size, launcher=self.launcher, nodes=self.nodes,
                         node_shell=self.node_shell)

    def _launcher(self, m: Any) -> Any:
        from stoker.layout import RunLayout
        from stoker_airflow.launcher import TrainerLauncher

        return TrainerLauncher(RunLayout.of_manifest(self.manifest_path).trainer(m.topic))

    def execute(self, context: Any) -> None:
        import time

        from stoker.layout import RunLayout, consumer_group
        from stoker.manifest import read_manifest
        from stoker.runs import training_skipped
        from stoker_airflow.sensors import lag_trigger

        m = read_manifest(self.manifest_path)
        skipped = training_skipped(m)
        if skipped:  # an empty night: the run ends, its report says why, no trainer waits on nothing
            from airflow.sdk.exceptions import AirflowSkipException

            raise AirflowSkipException(skipped)
        settings = self.line_settings()
        if settings:  # before anything of the night's trainer is touched: another night may hold the line
            take_line_lease(settings, m, context["ti"])
        launcher = self._launcher(m)
        launcher.adopt_or_reset(m)
        placement = self._placement()
        if launcher.running():
            self.log.info("trainer already running (%s): following it", launcher.where())
        else:
            launcher.stop(placement)  # what an earlier try left: ranks orphaned by a killed launcher, remote ranks
            launcher.files.failure.unlink(missing_ok=True)
            hook = StokerKafkaHook(self.kafka_config_id)
            config = hook.subprocess_config()
            extra = [*self.extra_args, *(["--log-keys", str(launcher.files.keys_log)] if self.log_keys else [])]
            plan = RunLayout.of_manifest(self.manifest_path).plan
            extra += ["--plan", str(plan)] if plan.is_file() else []  # the recipe and the line's settings
            if settings:
                parent = launch_parent(settings, launcher.files, m)
                prepare_replay(settings, launcher.files, m, parent, hook.client_config())
                self.log.info("night %s of line %s starts from %s", m.ds, settings.line, parent.describe())
                extra += init_args(parent) if plan.is_file() else trainer_args(settings, parent)
            env = {"STOKER_KAFKA_CONFIG": json.dumps(config)}
            if any(h not in LOCAL_HOSTS for h in self.nodes):  # ssh passes no environment: a 0600 file
                launcher.files.folder.mkdir(parents=True, exist_ok=True)
                paths.write_private(launcher.files.secrets, json.dumps(env))
                extra += ["--secrets-file", str(launcher.files.secrets)]
            cmd = launcher.commands(self.manifest_path, None if plan.is_file() else self.recipe, placement, extra)
            pid = launcher.start(m, cmd, env, self.world_size)
            self.log.info("trainer started (pid %d, %d ranks, try %d): %s; log %s", pid, self.world_size,
                          context["ti"].try_number, " & ".join(" ".join(c) for c in cmd), launcher.files.log)
        self.defer(trigger=lag_trigger(m, consumer_group(m.topic), self.kafka_config_id, self.poll_interval,
                                       time.time() + self.timeout_s, rc_file=str(launcher.files.rc)),
                   method_name="execute_complete")

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowException, AirflowFailException

        from stoker.layout import RunLayout, consumer_group
        from stoker.manifest import read_manifest
        from stoker_airflow.sensors import lag_failure

        m = read_manifest(self.manifest_path)
        launcher = self._launcher(m)
        launcher.files.secrets.unlink(missing_ok=True)
        settings = self.line_settings()
        if event["status"] == Status.CAUGHT_UP:
            holdout = RunLayout.of_manifest(self.manifest_path).holdout
            keep_replay_store(settings, m, launcher.files, StokerKafkaHook(self.kafka_config_id).client_config())
            night = join_line(settings, m, launcher.files, holdout) if settings else None
            if settings and self.gate_task_id:  # no night of the line launches before the gate decided
                hand_line_lease_to(settings, m, context["ti"], self.gate_task_id)
            elif settings:
                give_back_line_lease(settings, m, context["ti"])
            return {**launcher.describe(m.topic), "consumed": True, "line_night": str(night.folder) if night else None}
        why = lag_failure(event, m, consumer_group(m.topic), launcher.files, self.timeout_s)
        failure = _read_failure(launcher.files.failure)
        tries, restarts = context["ti"].try_number, self.retries or 0
        if event["status"] != Status.TRAINER_FAILED or failure or tries > restarts:
            launcher.stop(self._placement())  # failed for good: no trainer may go on training the night
            if settings:  # the line's next night may train (a retry keeps the lease: it continues the night)
                give_back_line_lease(settings, m, context["ti"])
        if failure:  # the trainer's own word: a relaunch cannot fix it (data deleted before it was read)
            raise AirflowFailException(f"{failure.get('message')} (trainer log: {launcher.files.log})")
        if event["status"] != Status.TRAINER_FAILED:
            raise AirflowFailException(why)  # a relaunch cannot help: timeout, retention, stopped early
        if tries > restarts:
            raise AirflowFailException(f"{why}; no restart left (train.max_restarts = {restarts}): fix the cause "
                                       "and clear this task, it resumes from the last checkpoint")
        raise AirflowException(f"{why}; restart {tries} of {restarts}: the retry relaunches it from its last "
                               "checkpoint")
