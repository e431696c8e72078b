"""Async triggers for the triggerer: Kafka's blocking admin calls run in a thread, never on the loop.

Each trigger carries an absolute ``deadline`` (epoch seconds) so a trigger that is serialised,
moved to another triggerer and restarted still times out when the sensor said it would.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from enum import StrEnum
from pathlib import Path
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from stoker.kafka import offsets as koffsets
from stoker.kafka import topics as ktopics
from stoker.kafka.lag import LagReport, compute_lag
from stoker.layout import TrainerFiles


class Status(StrEnum):
    """What a trigger's event reports (``event["status"]``); str values, so events stay plain JSON."""

    PUBLISHED = "published"
    """The topic's committed end offsets equal the manifest's."""
    MISMATCH = "mismatch"
    """The topic holds more than the manifest says (another writer)."""
    CAUGHT_UP = "caught_up"
    """The training group consumed the whole run and the trainer exited cleanly."""
    TRAINER_FAILED = "trainer_failed"
    """The trainer exited with an error or died without an exit code."""
    TRAINER_STOPPED_EARLY = "trainer_stopped_early"
    """The trainer exited cleanly with data left unread."""
    RETENTION_EXPIRING = "retention_expiring"
    """Under a tenth of the topic's retention left with data unread."""
    RETENTION_WARNING = "retention_warning"
    """Under a quarter of the topic's retention left with data unread (logged; the wait goes on)."""
    TIMEOUT = "timeout"
    """The wait ran past its deadline."""


async def _kafka_config(kafka_config_id: str) -> dict[str, Any]:
    from stoker_airflow.hooks import StokerKafkaHook

    return await asyncio.to_thread(StokerKafkaHook(kafka_config_id).client_config)


class KafkaPublishedTrigger(BaseTrigger):
    """Fires when the topic's read_committed end offsets equal the manifest's (or on the deadline)."""

    def __init__(self, *, topic: str, expected: dict[str, int], kafka_config_id: str = "kafka_default",
                 poll_interval: float = 5.0, deadline: float | None = None) -> None:
        super().__init__()
        self.topic = topic
        self.expected = {str(k): int(v) for k, v in expected.items()}
        self.kafka_config_id = kafka_config_id
        self.poll_interval = poll_interval
        self.deadline = deadline

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("stoker_airflow.triggers.kafka.KafkaPublishedTrigger", {
            "topic": self.topic, "expected": self.expected, "kafka_config_id": self.kafka_config_id,
            "poll_interval": self.poll_interval, "deadline": self.deadline})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        config = await _kafka_config(self.kafka_config_id)
        while True:
            try:
                actual = await asyncio.to_thread(koffsets.end_offsets, config, self.topic)
            except Exception as e:  # noqa: BLE001 - a transient broker error is retried until the deadline
                actual, error = {}, str(e)
            else:
                error = ""
            got = {str(k): v for k, v in actual.items()}
            status = published_status(got, self.expected)
            if status is not None:
                yield TriggerEvent({"status": str(status), "topic": self.topic, "end_offsets": got,
                                    "expected": self.expected})
                return
            if self.deadline is not None and time.time() >= self.deadline:
                yield TriggerEvent({"status": Status.TIMEOUT.value, "topic": self.topic, "end_offsets": got,
                                    "expected": self.expected, "error": error})
                return
            self.log.info("waiting for %s: end offsets %s, manifest %s %s", self.topic, got, self.expected, error)
            await asyncio.sleep(self.poll_interval)


def published_status(actual: dict[Any, int], expected: dict[Any, int]) -> Status | None:
    """``published`` when a topic's end offsets equal the manifest's, ``mismatch`` when it holds more
    than the manifest (another writer), None while the publish may still be completing."""
    if actual == expected:
        return Status.PUBLISHED
    if any(actual.get(p, 0) > want for p, want in expected.items()) or set(actual) - set(expected):
        return Status.MISMATCH
    return None


TRAINER_LOST = -1
"""The exit code given to a trainer whose launcher is gone without writing one (killed as a whole:
kill -9, a lost or preempted node, the OOM killer)."""


def trainer_exit(rc_file: str | None) -> int | None:
    """The followed trainer's exit code; ``TRAINER_LOST`` when its launcher is gone without one; None
    while it runs (or when no trainer is followed, or its liveness cannot be told on this host)."""
    if rc_file is None:
        return None
    from stoker.process import Heartbeat

    files = TrainerFiles(Path(rc_file).parent)
    alive = files.process.alive(Heartbeat(files.heartbeat))  # first: the shell writes rc, then exits
    try:
        return int(Path(rc_file).read_text().strip())
    except (OSError, ValueError):
        return TRAINER_LOST if alive is False else None


def retention_left(created_at: str, retention_ms: int, now: float) -> float | None:
    """Seconds before the run's first records may expire unread (retention counts from publication), None when
    nothing says (0) or the topic keeps its records for ever (Kafka's ``retention.ms = -1``)."""
    from datetime import datetime

    if retention_ms <= 0 or not created_at:
        return None
    return datetime.fromisoformat(created_at).timestamp() + retention_ms / 1000 - now


def retention_status(left: float | None, retention_ms: int, lag: int) -> Status | None:
    """``retention_warning`` with under a quarter of the retention left and lag, ``retention_expiring``
    with under a tenth (at most an hour): fail while the data is still there, not after."""
    if left is None or lag <= 0:
        return None
    if left < min(retention_ms / 1000 * 0.10, 3600):
        return Status.RETENTION_EXPIRING
    if left < retention_ms / 1000 * 0.25:
        return Status.RETENTION_WARNING
    return None


def lag_status(lag: int, max_lag: int, rc: int | None, following: bool = True) -> Status | None:
    """``caught_up`` / ``trainer_failed`` / ``trainer_stopped_early``, or None to keep waiting.

    When a trainer is followed, being caught up also needs it to have exited cleanly (its last
    checkpoint and export are written after the final offsets are committed).
    """
    if rc is not None and rc != 0:
        return Status.TRAINER_FAILED
    if lag <= max_lag and (rc == 0 or not following):
        return Status.CAUGHT_UP
    if rc == 0:
        return Status.TRAINER_STOPPED_EARLY
    return None


RETENTION_CHECK_S = 60.0
"""How often the lag trigger asks the cluster for the topic's live ``retention.ms``."""
PROGRESS_LOG_S = 60.0
"""The lag trigger polls every few seconds (a dead trainer is noticed at once) but logs an unchanged
progress line at most this often: a night of hours would otherwise log thousands of identical lines."""


class ProgressLog:
    """Says whether a progress line is worth logging: it changed, or ``every`` seconds have passed."""

    def __init__(self, every: float = PROGRESS_LOG_S) -> None:
        self.every, self.at = every, float("-inf")
        self.line: str | None = None

    def due(self, line: str, now: float) -> bool:
        if line == self.line and now - self.at < self.every:
            return False
        self.line, self.at = line, now
        return True


class KafkaLagTrigger(BaseTrigger):
    """Fires when a consumer group's lag on a topic is at most ``max_lag`` messages, logging progress.

    ``end`` and ``start`` come from the run manifest (the stage trusts it, not the live topic), so
    lag reaches exactly 0 when the group has committed the manifest's end offsets.
    """

    def __init__(self, *, topic: str, group_id: str, end: dict[str, int], start: dict[str, int] | None = None,
                 max_lag: int = 0, tokens_per_message: int = 0, kafka_config_id: str = "kafka_default",
                 poll_interval: float = 10.0, deadline: float | None = None, rc_file: str | None = None,
                 created_at: str = "", retention_ms: int = 0) -> None:
        super().__init__()
        self.topic = topic
        self.group_id = group_id
        self.end = {str(k): int(v) for k, v in end.items()}
        self.start = {str(k): int(v) for k, v in (start or {}).items()}
        self.max_lag = max_lag
        self.tokens_per_message = tokens_per_message
        self.kafka_config_id = kafka_config_id
        self.poll_interval = poll_interval
        self.deadline = deadline
        self.rc_file = rc_file
        self.created_at, self.retention_ms = created_at, retention_ms
        self._retention_checked = -RETENTION_CHECK_S

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("stoker_airflow.triggers.kafka.KafkaLagTrigger", {"rc_file": self.rc_file,
            "created_at": self.created_at, "retention_ms": self.retention_ms,
            "topic": self.topic, "group_id": self.group_id, "end": self.end, "start": self.start,
            "max_lag": self.max_lag, "tokens_per_message": self.tokens_per_message,
            "kafka_config_id": self.kafka_config_id, "poll_interval": self.poll_interval,
            "deadline": self.deadline})

    def _report(self, config: dict[str, Any]) -> LagReport:
        end = {int(k): v for k, v in self.end.items()}
        committed = koffsets.committed_offsets(config, self.group_id, self.topic, end)
        return compute_lag(end, committed, {int(k): v for k, v in self.start.items()},
                                  self.tokens_per_message)

    def _live_retention(self, config: dict[str, Any]) -> None:
        """The topic's ``retention.ms`` as the cluster holds it now, asked at most every ``RETENTION_CHECK_S``:
        the failure's advice ("raise retention.ms and clear") works only if a raised value is heard. The
        manifest's value stands while the broker cannot say."""
        now = time.monotonic()
        if now - self._retention_checked < RETENTION_CHECK_S:
            return
        self._retention_checked = now
        value = ktopics.topic_config(config, self.topic, "retention.ms")
        if value is not None and value.lstrip("-").isdigit() and int(value) != self.retention_ms:
            self.log.info("%s: retention.ms is %s on the cluster now (was %d)", self.topic, value, self.retention_ms)
            self.retention_ms = int(value)

    def _retention(self, lag: int) -> Status | None:
        """``retention_expiring`` to fail now; logs a warning while the margin shrinks."""
        left = retention_left(self.created_at, self.retention_ms, time.time())
        status = retention_status(left, self.retention_ms, lag)
        if status == Status.RETENTION_WARNING:
            self.log.warning("%s: the first records may expire in %.1f h (retention %.1f h) and %d messages are "
                             "unread: raise the topic's retention.ms or speed training up", self.topic,
                             (left or 0) / 3600, self.retention_ms / 3.6e6, lag)
            return None
        return status

    async def run(self) -> AsyncIterator[TriggerEvent]:
        config = await _kafka_config(self.kafka_config_id)
        last, progress = None, ProgressLog()
        while True:
            rc = trainer_exit(self.rc_file)
            if rc is not None and rc != 0:  # first, so a dead trainer is noticed while Kafka is unreachable too
                yield TriggerEvent({"status": Status.TRAINER_FAILED.value, "rc": rc, "lag": last})
                return
            try:
                report = await asyncio.to_thread(self._report, config)
                await asyncio.to_thread(self._live_retention, config)
            except Exception as e:  # noqa: BLE001
                if self.deadline is not None and time.time() >= self.deadline:
                    yield TriggerEvent({"status": Status.TIMEOUT.value, "error": str(e), "lag": last})
                    return
                self.log.warning("lag check of %s on %s failed, retrying: %s", self.group_id, self.topic, e)
                await asyncio.sleep(self.poll_interval)
                continue
            last = {"lag": report.lag, "lag_tokens": report.lag_tokens,
                    "consumed_fraction": report.consumed_fraction,
                    "partitions": {str(p.partition): p.lag for p in report.partitions}}
            status = (lag_status(report.lag, self.max_lag, trainer_exit(self.rc_file), self.rc_file is not None)
                      or self._retention(report.lag))
            if status is not None:
                yield TriggerEvent({"status": str(status), "rc": trainer_exit(self.rc_file), **last})
                return
            if self.deadline is not None and time.time() >= self.deadline:
                yield TriggerEvent({"status": Status.TIMEOUT.value, **last})
                return
            line = report.describe()
            if progress.due(line, time.monotonic()):
                self.log.info("group %s on %s: %s", self.group_id, self.topic, line)
            await self._nap()

    async def _nap(self) -> None:
        """``poll_interval``, cut short when the trainer exits meanwhile (its rc file appears): the end of a
        night is seen within a quarter second, not up to a poll later."""
        rc = Path(self.rc_file) if self.rc_file else None
        if rc is None or rc.exists():
            await asyncio.sleep(self.poll_interval)
            return
        end = time.monotonic() + self.poll_interval
        while (left := end - time.monotonic()) > 0 and not rc.exists():
            await asyncio.sleep(min(0.25, left))
