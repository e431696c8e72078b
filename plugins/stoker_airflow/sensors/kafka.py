"""Sensors of a refresh. The Kafka ones defer to async triggers, so a long wait holds no worker slot.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowFailException

from stoker.kafka import offsets as koffsets
from stoker.kafka import topics as ktopics
from stoker.kafka.lag import LagReport, compute_lag
from stoker.layout import RunLayout, TrainerFiles, consumer_group
from stoker.run.manifest import Manifest, read_manifest
from stoker_airflow.hooks import StokerKafkaHook
from stoker_airflow.triggers.kafka import (
    TRAINER_LOST,
    KafkaLagTrigger,
    KafkaPublishedTrigger,
    Status,
    lag_status,
    published_status,
    retention_left,
    retention_status,
    trainer_exit,
)


class _DeferrableKafkaSensor(BaseSensorOperator):
    def __init__(self, *, kafka_config_id: str = "kafka_default", poll_interval: float = 5.0,
                 deferrable: bool = True, **kwargs: Any) -> None:
        kwargs.setdefault("timeout", 3600)
        super().__init__(poke_interval=poll_interval, **kwargs)
        self.kafka_config_id = kafka_config_id
        self.poll_interval = poll_interval
        self.deferrable = deferrable

    def _config(self) -> dict[str, Any]:
        return StokerKafkaHook(self.kafka_config_id).client_config()

    def _deadline(self) -> float:
        return time.time() + self.timeout

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        if self.poke(context):
            return self._done(context)
        self.defer(trigger=self._trigger(), method_name="execute_complete")

    def _trigger(self) -> Any:
        raise NotImplementedError

    def _done(self, context: Any) -> Any:
        return None


class KafkaPublishedSensor(_DeferrableKafkaSensor):
    """Succeeds when the run topic's read_committed end offsets equal the manifest's."""

    template_fields: Sequence[str] = ("manifest_path",)

    def __init__(self, *, manifest_path: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.manifest_path = manifest_path

    def _manifest(self) -> Manifest:
        return read_manifest(self.manifest_path)

    def poke(self, context: Any) -> bool:
        m = self._manifest()
        actual = koffsets.end_offsets(self._config(), m.topic)
        status = published_status(actual, m.end_offsets())
        if status == Status.MISMATCH:
            raise AirflowFailException(f"topic {m.topic} holds more than its manifest: end offsets {actual}, "
                                       f"manifest {m.end_offsets()}: something else writes to it; re-run the date")
        self.log.info("topic %s end offsets %s, manifest %s", m.topic, actual, m.end_offsets())
        return status == Status.PUBLISHED

    def _trigger(self) -> KafkaPublishedTrigger:
        m = self._manifest()
        return KafkaPublishedTrigger(topic=m.topic, expected={str(k): v for k, v in m.end_offsets().items()},
                                     kafka_config_id=self.kafka_config_id, poll_interval=self.poll_interval,
                                     deadline=self._deadline())

    def _done(self, context: Any) -> dict[str, Any]:
        m = self._manifest()
        return {"topic": m.topic, "sequences": m.sequences, "end_offsets": m.end_offsets()}

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        if event["status"] == Status.PUBLISHED:
            return self._done(context)
        raise AirflowFailException(
            f"topic {event['topic']}: end offsets {event.get('end_offsets')} != manifest {event.get('expected')} "
            f"({event['status']} after {self.timeout:.0f}s{'; ' + event['error'] if event.get('error') else ''}): "
            "the publish did not complete; re-run tokenize_publish"
        )


class KafkaLagSensor(_DeferrableKafkaSensor):
    """Succeeds when ``group_id``'s lag on the run topic is at most ``max_lag`` messages.

    Logs progress (messages, tokens, % of the run consumed) while it waits; on timeout fails with
    the lag it last saw per partition.
    """

    template_fields: Sequence[str] = ("manifest_path", "group_id")

    def __init__(self, *, manifest_path: str, group_id: str | None = None, max_lag: int = 0,
                 follow_trainer: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if max_lag < 0:
            raise ValueError(f"max_lag = {max_lag}: must be >= 0")
        self.manifest_path = manifest_path
        self.group_id = group_id
        self.max_lag = max_lag
        self.follow_trainer = follow_trainer
        """Follow the run's trainer (launched by DeepSpeedTrainOperator) through its exit code."""

    def _group(self, m: Manifest) -> str:
        return self.group_id or consumer_group(m.topic)

    def _trainer(self, m: Manifest) -> TrainerFiles:
        return RunLayout.of_manifest(self.manifest_path).trainer(m.topic)

    def _rc_file(self, m: Manifest) -> str | None:
        return str(self._trainer(m).rc) if self.follow_trainer else None

    def _report(self) -> tuple[Manifest, LagReport]:
        m = read_manifest(self.manifest_path)
        committed = koffsets.committed_offsets(self._config(), self._group(m), m.topic, m.end_offsets())
        starts = {p.partition: p.start_offset for p in m.partitions}
        return m, compute_lag(m.end_offsets(), committed, starts, m.seq_len)

    def poke(self, context: Any) -> bool:
        rc = trainer_exit(self._rc_file(read_manifest(self.manifest_path)))
        if rc is not None and rc != 0:  # first, so a dead trainer is noticed while Kafka is unreachable too
            return self._finish({"status": Status.TRAINER_FAILED.value, "rc": rc, "lag": None}) is not None
        m, report = self._report()
        self.log.info("group %s: %s", self._group(m), report.describe())
        rc_file = self._rc_file(m)
        status = lag_status(report.lag, self.max_lag, trainer_exit(rc_file), rc_file is not None)
        live = ktopics.topic_config(self._config(), m.topic, "retention.ms")  # raised on the cluster: heard
        retention = int(live) if live is not None and live.lstrip("-").isdigit() else m.retention_ms
        left = retention_left(m.created_at, retention, time.time())
        if status is None and retention_status(left, retention, report.lag) == Status.RETENTION_EXPIRING:
            status = Status.RETENTION_EXPIRING
        if status is None:
            return False
        return self._finish({"status": status, "rc": trainer_exit(rc_file), "lag": report.lag,
                             "lag_tokens": report.lag_tokens, "consumed_fraction": report.consumed_fraction,
                             "partitions": {str(p.partition): p.lag for p in report.partitions}}) is not None

    def _trigger(self) -> KafkaLagTrigger:
        m = read_manifest(self.manifest_path)
        return lag_trigger(m, self._group(m), self.kafka_config_id, self.poll_interval, self._deadline(),
                           rc_file=self._rc_file(m), max_lag=self.max_lag)

    def _finish(self, event: dict[str, Any]) -> dict[str, Any]:
        m = read_manifest(self.manifest_path)
        if event["status"] == Status.CAUGHT_UP:
            return event
        why = lag_failure(event, m, self._group(m), self._trainer(m), self.timeout)
        if event["status"] == Status.TRAINER_FAILED:
            why += "; the train task's retry relaunches it from its last checkpoint"
        raise AirflowFailException(why)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        return self._finish(event)


def lag_trigger(m: Manifest, group: str, kafka_config_id: str, poll_interval: float, deadline: float, *,
                rc_file: str | None, max_lag: int = 0) -> KafkaLagTrigger:
    """The trigger that follows ``group`` on the run's topic (and the trainer behind ``rc_file``)."""
    return KafkaLagTrigger(
        topic=m.topic, group_id=group, end={str(k): v for k, v in m.end_offsets().items()},
        start={str(p.partition): p.start_offset for p in m.partitions}, max_lag=max_lag,
        tokens_per_message=m.seq_len, kafka_config_id=kafka_config_id, poll_interval=poll_interval,
        deadline=deadline, rc_file=rc_file, created_at=m.created_at, retention_ms=m.retention_ms)


def lag_failure(event: dict[str, Any], m: Manifest, group: str, trainer: TrainerFiles, timeout: float) -> str:
    """Why a followed run did not end caught up: the status of a lag trigger's event, in words."""
    status = event["status"]
    if status == Status.TRAINER_FAILED:
        how = ("was killed as a whole (its launcher is gone without an exit code: kill -9, a lost node, the "
               "OOM killer)" if event.get("rc") == TRAINER_LOST else f"exited with {event.get('rc')}")
        return f"the trainer {how} at {event.get('lag')} messages of lag: see {trainer.log}"
    if status == Status.RETENTION_EXPIRING:
        return (f"{m.topic} was published at {m.created_at} with retention.ms {m.retention_ms}: its first records "
                f"may be deleted within the hour while group {group} still lags by {event.get('lag')} messages. "
                f"Raise it now (kafka-configs --alter --entity-type topics --entity-name {m.topic} --add-config "
                "retention.ms=...) and clear this task, or the run loses data unread")
    if status == Status.TRAINER_STOPPED_EARLY:
        return (f"the trainer finished but group {group} still lags by {event.get('lag')} "
                f"messages per partition {event.get('partitions')}: was --max-steps set?")
    return (f"consumer group {group} still lags after {timeout:.0f}s: {event.get('lag')} messages "
            f"({event.get('lag_tokens')} tokens) per partition {event.get('partitions')} "
            f"{event.get('error', '')}: is the trainer running? raise train.timeout_s or max_lag")
