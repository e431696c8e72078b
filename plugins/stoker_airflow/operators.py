"""Operators of a refresh."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator

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


class DeepSpeedTrainOperator(BaseOperator):
    """Launches the trainer on the run's topic, detached, and returns: a training run can take hours
    and must not hold a worker slot (``await_consumed`` follows it, deferred).

    The launcher (``torchrun``, or ``deepspeed`` with a hostfile for several nodes) runs in a session
    of its own with its log, pid and exit code under ``out_dir``. A retry while that trainer still
    runs adopts it instead of starting a second one on the same checkpoint folder; a later start
    resumes from the latest checkpoint.
    """

    template_fields: Sequence[str] = ("manifest_path", "out_dir")

    def __init__(self, *, manifest_path: str, out_dir: str, recipe: str = "debug_cpu", world_size: int = 1,
                 launcher: str = "torchrun", kafka_config_id: str = "kafka_default",
                 extra_args: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if world_size < 1:
            raise ValueError(f"world_size = {world_size}: must be >= 1")
        if launcher not in ("torchrun", "deepspeed"):
            raise ValueError(f"launcher = {launcher!r}: must be 'torchrun' or 'deepspeed'")
        self.manifest_path = manifest_path
        self.out_dir = out_dir
        self.recipe = recipe
        self.world_size = world_size
        self.launcher = launcher
        self.kafka_config_id = kafka_config_id
        self.extra_args = list(extra_args or [])

    def execute(self, context: Any) -> dict[str, Any]:
        from stoker.manifest import read_manifest
        from stoker.trainer_process import TrainerProcess

        m = read_manifest(self.manifest_path)
        proc = TrainerProcess(Path(self.out_dir) / m.topic)
        if proc.running():
            self.log.info("trainer already running (pid %s): following it", proc.pid())
            return proc.describe(m.topic)
        config = StokerKafkaHook(self.kafka_config_id).get_config()
        cmd = proc.command(self.manifest_path, self.recipe, self.world_size, self.launcher, self.extra_args)
        pid = proc.start(cmd, {"STOKER_KAFKA_CONFIG": json.dumps(config)}, self.world_size)
        self.log.info("trainer started (pid %d, %d ranks): %s; log %s", pid, self.world_size, " ".join(cmd),
                      proc.log_path)
        return proc.describe(m.topic)
