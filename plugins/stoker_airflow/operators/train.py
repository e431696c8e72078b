"""The train task: the trainer launched detached on the run's topic and followed, deferred, to the end."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator

from stoker import paths
from stoker.config.corpus import TrainConfig
from stoker_airflow.hooks import StokerKafkaHook
from stoker_airflow.launcher import LOCAL_HOSTS, Placement, TrainerNotStopped
from stoker_airflow.lines import (
    give_back_line_lease,
    hand_line_lease_to,
    init_args,
    join_line,
    keep_replay_store,
    launch_parent,
    prepare_replay,
    take_line_lease,
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

    A mixture night (``mix_plan_path``: a line's DAG) trains the plan's rows of every component's topic; the
    manifest is then its lead component's. The night is over when the trainer exits cleanly, not when the lead's
    lag reaches 0 (a shrunk night leaves records of it unread by design): the trainer exits 0 only once every
    partition of every topic gave the rows the plan names (``DataLost`` otherwise).
    """

    template_fields: Sequence[str] = ("manifest_path", "mix_plan_path")

    def __init__(self, *, manifest_path: str, kafka_config_id: str = "kafka_default",
                 extra_args: list[str] | None = None, poll_interval: float = 5.0, gate_task_id: str | None = None,
                 mix_plan_path: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.manifest_path = manifest_path
        self.mix_plan_path = mix_plan_path
        self.kafka_config_id = kafka_config_id
        self.extra_args = list(extra_args or [])
        """Trainer flags for a debugging or benchmark run (``--max-steps``, ``--set``); none in a refresh."""
        self.poll_interval = poll_interval
        self.gate_task_id = gate_task_id
        """The task of this run that decides whether the joined night is the line's head: the lease goes to it."""

    def train_config(self) -> TrainConfig:
        """The corpus's train settings as the run's plan decided them (the publish task wrote it): read when the
        task runs, never from the DAG file at parse time, so a re-parse cannot meet an older plan."""
        from stoker.layout import RunLayout
        from stoker.run.plan import read_plan

        return read_plan(RunLayout.of_manifest(self.manifest_path).plan).corpus.train

    def _plan_path(self) -> str:
        from stoker.layout import RunLayout

        return str(RunLayout.of_manifest(self.manifest_path).plan)

    @staticmethod
    def _placement(train: TrainConfig) -> Placement:
        return Placement(world_size=train.world_size, launcher=train.launcher, nodes=list(train.nodes),
                         node_shell=train.node_shell)

    def _launcher(self, m: Any) -> Any:
        from stoker.layout import RunLayout
        from stoker_airflow.launcher import TrainerLauncher

        return TrainerLauncher(RunLayout.of_manifest(self.manifest_path).trainer(m.topic))

    def execute(self, context: Any) -> None:
        import time

        from stoker.layout import consumer_group
        from stoker.reports.runs import training_skipped
        from stoker.run.manifest import read_manifest
        from stoker_airflow.sensors.kafka import lag_trigger

        m = read_manifest(self.manifest_path)
        skipped = training_skipped(m)
        if skipped:  # an empty night: the run ends, its report says why, no trainer waits on nothing
            from airflow.sdk.exceptions import AirflowSkipException

            raise AirflowSkipException(skipped)
        train = self.train_config()
        if self.mix_plan_path and train.replay > 0:
            from airflow.sdk.exceptions import AirflowFailException

            raise AirflowFailException(f"{m.corpus}: train.replay = {train.replay} and the night is a mixture "
                                       f"({self.mix_plan_path}): replay inside a mixture is not built yet; set "
                                       "train.replay to 0 in the line's corpora")
        # before anything of the night's trainer is touched: another night may hold the line
        take_line_lease(train, m, context["ti"])
        launcher = self._launcher(m)
        launcher.adopt_or_reset(m)
        placement = self._placement(train)
        if launcher.running():
            self.log.info("trainer already running (%s): following it", launcher.where())
        else:
            launcher.stop(placement)  # what an earlier try left: ranks orphaned by a killed launcher, remote ranks
            launcher.files.failure.unlink(missing_ok=True)
            hook = StokerKafkaHook(self.kafka_config_id)
            config = hook.subprocess_config()
            extra = [*self.extra_args, *(["--log-keys", str(launcher.files.keys_log)] if train.log_keys else []),
                     *(["--mix", self.mix_plan_path] if self.mix_plan_path else [])]
            parent = launch_parent(train, launcher.files, m)
            prepare_replay(train, launcher.files, m, parent, hook.client_config())
            self.log.info("night %s of line %s starts from %s", m.ds, train.line, parent.describe())
            extra += init_args(parent)
            env = {"STOKER_KAFKA_CONFIG": json.dumps(config)}
            if any(h not in LOCAL_HOSTS for h in train.nodes):  # ssh passes no environment: a 0600 file
                launcher.files.folder.mkdir(parents=True, exist_ok=True)
                paths.write_private(launcher.files.secrets, json.dumps(env))
                extra += ["--secrets-file", str(launcher.files.secrets)]
            cmd = launcher.commands(self.manifest_path, self._plan_path(), placement, extra)
            pid = launcher.start(m, cmd, env, train.world_size)
            self.log.info("trainer started (pid %d, %d ranks, try %d): %s; log %s", pid, train.world_size,
                          context["ti"].try_number, " & ".join(" ".join(c) for c in cmd), launcher.files.log)
        # a mixture's lead lag is no measure of the night (see the class): its trainer's clean exit is
        self.defer(trigger=lag_trigger(m, consumer_group(m.topic), self.kafka_config_id, self.poll_interval,
                                       time.time() + train.timeout_s, rc_file=str(launcher.files.rc),
                                       max_lag=m.sequences if self.mix_plan_path else 0),
                   method_name="execute_complete")

    def _check_mixture(self, files: Any) -> None:
        """The trainer's summary accounts for the plan's night (what ``stoker runs show`` reports)."""
        from airflow.sdk.exceptions import AirflowFailException

        from stoker.lines.mix_plan import read_plan

        plan = read_plan(str(self.mix_plan_path))
        summary = json.loads(files.summary.read_text()) if files.summary.is_file() else {}
        trained = (summary.get("mixture") or {}).get("realised", {}).get("rows")
        if trained != plan.night.rows:
            raise AirflowFailException(f"the trainer exited cleanly but its summary ({files.summary}) accounts for "
                                       f"rows {trained}, the plan {self.mix_plan_path} names {plan.night.rows}: see "
                                       f"{files.log}")

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowException, AirflowFailException

        from stoker.layout import RunLayout, consumer_group
        from stoker.run.manifest import read_manifest
        from stoker_airflow.sensors.kafka import lag_failure

        m = read_manifest(self.manifest_path)
        launcher = self._launcher(m)
        launcher.files.secrets.unlink(missing_ok=True)
        train = self.train_config()
        if event["status"] == Status.CAUGHT_UP:
            holdout = RunLayout.of_manifest(self.manifest_path).holdout
            if self.mix_plan_path:
                self._check_mixture(launcher.files)
            else:
                keep_replay_store(train, m, launcher.files, StokerKafkaHook(self.kafka_config_id).client_config())
            night = join_line(train, m, launcher.files, holdout)
            if self.gate_task_id:  # no night of the line launches before the gate decided
                hand_line_lease_to(train, m, context["ti"], self.gate_task_id)
            else:
                give_back_line_lease(train, m, context["ti"])
            return {**launcher.describe(m.topic), "consumed": True, "line_night": str(night.folder)}
        why = lag_failure(event, m, consumer_group(m.topic), launcher.files, train.timeout_s)
        failure = _read_failure(launcher.files.failure)
        tries, restarts = context["ti"].try_number, self.retries or 0
        if event["status"] != Status.TRAINER_FAILED or failure or tries > restarts:
            try:
                launcher.stop(self._placement(train))  # failed for good: no trainer may go on training the night
            except TrainerNotStopped as e:  # said, and the record kept: a clear's relaunch must stop it first
                self.log.error("%s", e)
            # the line's next night may train (a retry keeps the lease: it continues the night)
            give_back_line_lease(train, m, context["ti"])
        if failure:  # the trainer's own word: a relaunch cannot fix it (data deleted before it was read)
            raise AirflowFailException(f"{failure.get('message')} (trainer log: {launcher.files.log})")
        if event["status"] != Status.TRAINER_FAILED:
            raise AirflowFailException(why)  # a relaunch cannot help: timeout, retention, stopped early
        if tries > restarts:
            raise AirflowFailException(f"{why}; no restart left (train.max_restarts = {restarts}): fix the cause "
                                       "and clear this task, it resumes from the last checkpoint")
        raise AirflowException(f"{why}; restart {tries} of {restarts}: the retry relaunches it from its last "
                               "checkpoint")
