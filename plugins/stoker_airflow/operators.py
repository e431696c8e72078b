"""Operators of a refresh."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from stoker import paths
from stoker_airflow.hooks import StokerKafkaHook

SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.adaptive.enabled": "true",
    "spark.task.maxFailures": "4",
    "spark.executorEnv.TOKENIZERS_PARALLELISM": "false",
}


class TokenizePublishOperator(SparkSubmitOperator):
    """``spark-submit spark_jobs/tokenize_publish.py`` through ``spark_default`` (any master).

    The Kafka client config is read from ``kafka_config_id`` here and handed to the job in the
    environment (``STOKER_KAFKA_CONFIG``), so secrets never appear on a command line.
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields, "corpus_path", "ds", "topic", "run_dir", "extra_args")

    def __init__(self, *, corpus_path: str, ds: str, topic: str, run_dir: str,
                 kafka_config_id: str = "kafka_default", extra_args: list[str] | None = None,
                 **kwargs: Any) -> None:
        if not Path(corpus_path).is_file():
            raise ValueError(f"corpus_path = {corpus_path!r}: no such corpus config")
        kwargs.setdefault("application", str(paths.project_root() / "spark_jobs" / "tokenize_publish.py"))
        kwargs.setdefault("conf", dict(SPARK_CONF))
        super().__init__(**kwargs)
        self.corpus_path = corpus_path
        self.ds = ds
        self.topic = topic
        self.run_dir = run_dir
        self.kafka_config_id = kafka_config_id
        self.extra_args = list(extra_args or [])

    def execute(self, context: Any) -> None:
        self.application_args = ["--corpus", self.corpus_path, "--ds", self.ds, "--topic", self.topic,
                                 "--run-dir", self.run_dir, *self.extra_args]
        config = StokerKafkaHook(self.kafka_config_id).get_config()
        self.env_vars = {**(self.env_vars or {}), "STOKER_KAFKA_CONFIG": json.dumps(config),
                         "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        super().execute(context)
