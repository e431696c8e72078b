"""The Spark stage's operator: the run's plan written, then spark-submit of
``spark_jobs/tokenize_publish.py`` with the connection's settings.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from stoker import paths
from stoker_airflow.hooks import StokerKafkaHook
from stoker_airflow.lines import (
    check_before_publish,
)
from stoker_airflow.operators.report import _annotate_outlets

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
        from stoker.run.plan import RUN_PARAMS, plan_run
        from stoker_airflow.operators.review import decided_ahead

        given = context.get("params") or {}
        params = {p.name: given[p.name] for p in RUN_PARAMS if p.name in given}
        try:
            plan = plan_run(self.corpus_path, self.ds, params, attempt=context["ti"].try_number)
            decided_ahead(plan, context)  # a held night's decision by the run's params: a named, allowed user
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
        from stoker.stores.drops import uses_s3

        if uses_s3(cfg):  # the source or the near-dedup index
            from stoker.stores.connectors import s3a_jars
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
        _annotate_outlets(self, context, run.run_dir, partition=self.ds)  # the corpus's night, keyed by its date

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
        from stoker.kafka import topics as ktopics
        from stoker.layout import earlier_attempts, run_of_topic

        stale = earlier_attempts(topic, ktopics.list_topics(config, run_of_topic(topic)))
        self.log.info("deleting topics of earlier attempts and the task log: %s", stale)
        ktopics.delete_topics(config, stale)
