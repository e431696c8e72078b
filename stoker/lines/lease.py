"""A model line's training lease.

The line's Airflow pool lets one train task run (or wait deferred) at a time, but a task leaves the pool
between its trigger firing and its resume (state `scheduled`), and between a failed try and its retry
(`up_for_retry`). Another night of the line would start training in that gap, from a line its night has not
joined yet. The lease closes it: taken at launch, given back when the night joined its line or its task failed
for good. A holder whose task is over (it died with its worker) is taken over.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from stoker.exceptions import StokerError
from stoker.files import atomic_write_json
from stoker.layout import LineLayout

log = logging.getLogger("stoker.lines")


@dataclass(kw_only=True, slots=True)
class LeaseHolder:
    """The train task that trains a night of the line, and which night."""

    dag_id: str
    run_id: str
    task_id: str
    corpus: str
    ds: str
    topic: str
    since: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    def same_task(self, other: LeaseHolder) -> bool:
        return (self.dag_id, self.run_id, self.task_id) == (other.dag_id, other.run_id, other.task_id)

    def same_run(self, other: LeaseHolder) -> bool:
        """Of the same DAG run: the same night (its train task, or the evaluate task it handed the lease to)."""
        return (self.dag_id, self.run_id) == (other.dag_id, other.run_id)

    def describe(self) -> str:
        return f"night {self.ds} of {self.corpus} (run {self.run_id} of {self.dag_id}, since {self.since})"


def lease_file(line: LineLayout) -> Path:
    return line.folder / "training.lease.json"


class _Locked:
    """An exclusive lock on the line's lease (fcntl, on a file of its own beside it). The line's folder is on the
    shared folder when workers run on several hosts: its file system must honour ``flock`` across hosts (NFSv4
    and Lustre with ``-o flock`` do; NFSv3 without lockd, and some FUSE stores, do not: there two hosts could
    both take the lease)."""

    def __init__(self, line: LineLayout) -> None:
        self.path = line.folder / ".training.lease.lock"

    def __enter__(self) -> _Locked:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # closing releases the lock


def lease_holder(line: LineLayout) -> LeaseHolder | None:
    f = lease_file(line)
    try:
        return LeaseHolder(**json.loads(f.read_text()))
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, TypeError) as e:
        raise StokerError(f"{f}: unreadable training lease ({e}): remove it when no night of line "
                          f"{line.name} trains") from None


def take_lease(line: LineLayout, me: LeaseHolder, holder_alive: Any) -> LeaseHolder | None:
    """Take the line's training lease for ``me``; returns None when taken (or already held by this same
    task: a retry, a resume; or by another task of the same DAG run: a cleared run's train task takes back what
    it had handed its evaluate task, which a clear left waiting behind it), else the other holder, which still
    trains. ``holder_alive(holder)`` says whether another run's holder can still run; one that cannot (it died
    without giving the lease back) is taken over."""
    with _Locked(line):
        cur = lease_holder(line)
        if cur is not None and cur.same_run(me) and not cur.same_task(me):
            log.info("line %s: %s takes back the lease its run's %s held (the run was cleared)", line.name,
                     me.task_id, cur.task_id)
        elif cur is not None and not cur.same_task(me):
            if holder_alive(cur):
                return cur
            log.warning("line %s: the training lease of %s is taken over: its task is over", line.name,
                        cur.describe())
        elif cur is not None:
            me.since = cur.since
        atomic_write_json(lease_file(line), asdict(me))
        return None


def give_back_lease(line: LineLayout, me: LeaseHolder) -> bool:
    """Give the lease back if ``me`` holds it (a no-op otherwise); True when given back."""
    with _Locked(line):
        cur = lease_holder(line)
        if cur is None or not cur.same_task(me):
            return False
        lease_file(line).unlink()
        return True


def hand_over_lease(line: LineLayout, me: LeaseHolder, task_id: str) -> bool:
    """Pass the lease to another task of the same run (the train task, once its night joined the line, to the
    task that gates it): no other night of the line may launch before the gate has decided what it continues.
    A no-op when ``me`` does not hold it; True when handed over."""
    with _Locked(line):
        cur = lease_holder(line)
        if cur is None or not cur.same_task(me):
            return False
        cur.task_id = task_id
        atomic_write_json(lease_file(line), asdict(cur))
        return True
