"""How Stoker's Kafka clients are made: named settings per kind of client (:class:`Role`) on top of
the cluster's own client config (the ``kafka_default`` connection's extra), and one AdminClient per
cluster config, reused for the life of the process.

Functions over a plain config dict, not a client object handed around: the config is what crosses
process boundaries (a Spark task, a trainer rank, the triggerer), and a librdkafka handle cannot.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from enum import StrEnum
from typing import Any


class Role(StrEnum):
    """The named client settings Stoker's Kafka clients are made with, on top of the cluster's own
    (the connection's client config): each kind of client is spelled once, here."""

    READER = "reader"
    """Reads partitions to their end, assigned (never joins a group, never commits), committed
    transactions only: the checks, the publish job's resume and verification, the tools."""
    GROUP_MEMBER = "group_member"
    """Reads and commits a group's offsets by the group protocol without joining it."""
    TRAINER = "trainer"
    """The training data source: committed transactions only, positions from the checkpoint (an
    offset out of range is an error, never a silent reset), commits only by the checkpoint."""
    PUBLISHER = "publisher"
    """The publish job's transactional, idempotent producer."""


_ROLE_SETTINGS: dict[Role, dict[str, Any]] = {
    Role.READER: {"enable.auto.commit": False, "enable.partition.eof": True, "isolation.level": "read_committed"},
    Role.GROUP_MEMBER: {"enable.auto.commit": False, "enable.auto.offset.store": False},
    Role.TRAINER: {"isolation.level": "read_committed", "auto.offset.reset": "error", "enable.auto.commit": False,
                   "enable.auto.offset.store": False, "enable.partition.eof": True, "fetch.wait.max.ms": 50},
    Role.PUBLISHER: {"enable.idempotence": True, "acks": "all", "linger.ms": 20, "batch.size": 1 << 20},
}


def client_config(config: Mapping[str, Any], role: Role, **extra: Any) -> dict[str, Any]:
    """The cluster's client config with ``role``'s settings and the caller's (``group.id``, ...)."""
    return {**config, **_ROLE_SETTINGS[role], **extra}


def consumer(config: Mapping[str, Any], role: Role, group: str, **extra: Any) -> Any:
    from confluent_kafka import Consumer

    return Consumer(client_config(config, role, **{"group.id": group, **extra}))


def producer(config: Mapping[str, Any], **extra: Any) -> Any:
    from confluent_kafka import Producer

    return Producer(client_config(config, Role.PUBLISHER, **extra))


ADMIN_IDLE_S = 120.0
"""A reused AdminClient not asked for this long is closed (at the next call)."""
_admins: dict[tuple[Any, ...], list[Any]] = {}
_admins_lock = threading.Lock()


def admin(config: Mapping[str, Any]) -> Any:
    """The AdminClient of this cluster config, made once per process and reused (thread-safe): a trigger
    polling every few seconds, or a 0.2 s wait loop, keeps one connection instead of one per call. A
    config holding a callable (an ``error_cb``) gets a client of its own. A forked child makes its own."""
    from confluent_kafka.admin import AdminClient

    if any(callable(v) for v in config.values()):
        return AdminClient(dict(config))
    key = (os.getpid(), *sorted((str(k), str(v)) for k, v in config.items()))
    now = time.monotonic()
    with _admins_lock:
        for old in [k for k, (_, used) in _admins.items() if now - used > ADMIN_IDLE_S or k[0] != os.getpid()]:
            del _admins[old]
        entry = _admins.get(key)
        if entry is None:
            entry = _admins[key] = [AdminClient(dict(config)), now]
        entry[1] = now
        return entry[0]


def forget_admins(bootstrap: str | None = None) -> int:
    """Drop this process's reused AdminClients of the cluster at ``bootstrap`` (its ``bootstrap.servers``), or all:
    a process that stops a broker asks it nothing more, and a kept client would reconnect to it (and log
    "Connection refused" every second) until the process ends. The number dropped."""
    with _admins_lock:
        gone = [k for k in _admins if bootstrap is None or ("bootstrap.servers", bootstrap) in k[1:]]
        for k in gone:
            del _admins[k]
    return len(gone)
