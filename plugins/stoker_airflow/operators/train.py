"""Operators of a refresh.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator

from stoker import paths
from stoker.config.corpus import NODE_SHELL
from stoker.lines.parents import LineSettings
from stoker_airflow.hooks import StokerKafkaHook
from stoker_airflow.launcher import LOCAL_HOSTS, Placement
from stoker_airflow.lines import (
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
from stoker_airflow.triggers.kafka import Status


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
        from stoker.run.plan import read_plan

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
        from stoker.reports.runs import training_skipped
        from stoker.run.manifest import read_manifest
        from stoker_airflow.sensors.kafka import lag_trigger

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
        from stoker.run.manifest import read_manifest
        from stoker_airflow.sensors.kafka import lag_failure

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
