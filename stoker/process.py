"""A process this project started, found again from a small record file.

The record (JSON: pid and the kernel's start time of that pid) lets any later process — a retried
Airflow task, a triggerer, ``make down``, a person with a shell — tell whether *that very process*
still runs (a reused pid has another start time) and stop its whole process group and every
descendant, TERM first and KILL after a grace period. Every long-lived process the project starts
(the embedded broker, the local stack's services, the test servers, a detached trainer) is started
with :meth:`ProcessRecord.spawn` in a session of its own, so its pid is also its process group.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def start_ticks(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot, or None if no such (live) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):  # exited, not yet reaped: it runs no more
        return None
    return int(fields[19])  # field 22 of stat: start time


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    """``path`` holds ``{"pid": ..., "start": ...}`` of one process started by the project."""

    path: Path

    def spawn(self, cmd: Sequence[str], *, log: Path, env: dict[str, str] | None = None,
              cwd: Path | str | None = None) -> subprocess.Popen[bytes]:
        """Start ``cmd`` detached (own session, stdin closed, output appended to ``log``) and record it."""
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, cwd=cwd, start_new_session=True)
        self.write(proc.pid)
        return proc

    def write(self, pid: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"pid": pid, "start": start_ticks(pid), "host": socket.gethostname()}))
        os.replace(tmp, self.path)

    def _read(self) -> tuple[int, int | None, str | None] | None:
        """pid, start time and host of the record (None: no readable record)."""
        try:
            rec = json.loads(self.path.read_text())
            return int(rec["pid"]), rec.get("start"), rec.get("host")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def pid(self) -> int | None:
        """The recorded pid, if that very process still runs on this host (another host's pid means
        nothing here: the same number may be a live process of this host, even with the same start time)."""
        rec = self._read()
        if rec is None or rec[2] not in (None, socket.gethostname()):
            return None
        pid, start, _ = rec
        return pid if start is not None and start_ticks(pid) == start else None

    def running(self) -> bool:
        return self.pid() is not None

    def alive(self, heartbeat: Heartbeat | None = None) -> bool | None:
        """True or False for a process recorded on this host (its pid); for one of another host, what
        its ``heartbeat`` says (fresh or stale); None when that cannot be told here (no record, or
        another host's record without a heartbeat: a triggerer elsewhere must not call a live trainer
        dead)."""
        rec = self._read()
        if rec is None:
            return None
        if rec[2] not in (None, socket.gethostname()):
            lost = heartbeat.lost() if heartbeat is not None else None
            return None if lost is None else not lost
        return self.running()

    def host(self) -> str | None:
        """The host the recorded process runs on (None: no record, or one of an earlier Stoker: this host)."""
        rec = self._read()
        return None if rec is None else rec[2]

    def elsewhere(self) -> bool:
        """Whether the record is of another host (its pid means nothing here)."""
        return self.host() not in (None, socket.gethostname())

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)

    def stop(self, sig: int = signal.SIGTERM, grace: float = 30.0) -> bool:
        """Stop the recorded process's group and descendants; False if it was not running. A record of another
        host is kept: nothing here can stop that process (``stoker_airflow.launcher`` asks its host)."""
        if self.elsewhere():
            return False
        pid = self.pid()
        if pid is not None:
            stop_tree(pid, sig, grace)
        self.clear()
        return pid is not None


HEARTBEAT_S = 5.0
"""How often a detached process's supervising shell writes its heartbeat."""
HEARTBEAT_STALE_S = 1.5 * HEARTBEAT_S
"""A heartbeat older than this is stale (its host lost, its whole session killed): one beat missed by half a
period. A deployment whose shared folder caches file contents (NFS holds attributes 3-60 s) raises it with
``STOKER_HEARTBEAT_STALE_S`` on the hosts that watch trainers (the triggerer, the workers). The hosts' clocks
must agree to a second or so (NTP), as they must for Kafka's and Spark's timeouts."""
STALE_ENV = "STOKER_HEARTBEAT_STALE_S"


def staleness() -> float:
    """The staleness in force: ``STOKER_HEARTBEAT_STALE_S`` where set, else :data:`HEARTBEAT_STALE_S`."""
    value = os.environ.get(STALE_ENV)
    return float(value) if value else HEARTBEAT_STALE_S


_STALE_SEEN: dict[str, tuple[int, float]] = {}
"""Per heartbeat file, this process's first stale reading of it (its beat number, when on the monotonic clock):
a process is called lost only by a second stale reading of the same beat, a staleness later."""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A file the supervising shell of a detached process rewrites every ``HEARTBEAT_S`` while that
    shell lives (``{"host", "pid", "beat", "at"}``), where every host can read it (the shared run
    folder): liveness that crosses hosts, where a pid means nothing."""

    path: Path

    def shell_loop(self, period: float = HEARTBEAT_S) -> str:
        """Bash for the supervising shell: a background loop (its pid in ``$hb``) that the shell stops
        with :data:`STOP_HEARTBEAT` before it exits, and that ends by itself if the shell (``$$``) is gone;
        TERM stops its sleep too, so nothing of it outlives the shell."""
        tmp, path = shlex.quote(str(self.path) + ".tmp"), shlex.quote(str(self.path))
        return ("( trap 'kill $s 2>/dev/null; wait $s 2>/dev/null; exit 0' TERM; "
                f"n=0; while kill -0 $$ 2>/dev/null; do n=$((n+1)); "
                f"printf '{{\"host\": \"%s\", \"pid\": %d, \"beat\": %d, \"at\": %s}}\\n' \"$HOSTNAME\" "
                f"$$ $n \"$(date +%s.%N)\" > {tmp} && mv -f {tmp} {path}; sleep {period:g} & s=$!; wait $s; "
                "done ) & hb=$!;")

    def read(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and "at" in data else None

    def age(self, now: float | None = None) -> float | None:
        """Seconds since the last beat (None: no heartbeat yet)."""
        data = self.read()
        return None if data is None else (time.time() if now is None else now) - float(data["at"])

    def fresh(self, now: float | None = None, stale_after: float | None = None) -> bool | None:
        age = self.age(now)
        return None if age is None else age <= (staleness() if stale_after is None else stale_after)

    def lost(self) -> bool | None:
        """Whether the process behind it is gone: True only after two stale readings of the same beat a staleness
        apart (one stale reading can be a slow shared file system, not a lost host); False while it beats;
        None while that cannot be said yet (no heartbeat, or one stale reading so far)."""
        data, limit = self.read(), staleness()
        if data is None:
            return None
        key = str(self.path)
        if time.time() - float(data["at"]) <= limit:
            _STALE_SEEN.pop(key, None)
            return False
        beat, seen = int(data.get("beat", 0)), _STALE_SEEN.get(key)
        if seen is None or seen[0] != beat:
            _STALE_SEEN[key] = (beat, time.monotonic())
            return None
        return True if time.monotonic() - seen[1] >= min(limit, HEARTBEAT_S) else None


STOP_HEARTBEAT = "kill $hb 2>/dev/null; wait $hb 2>/dev/null; "
"""Bash: stop the loop of :meth:`Heartbeat.shell_loop` (before the shell writes its exit code)."""

TAG_VAR = "STOKER_PROCESS_TAG"
"""An environment entry a launcher sets for a process tree it starts (the trainer: its folder). Every
descendant inherits it, also one that left the tree: torch elastic starts each rank in a session of its
own, so a rank whose launcher was killed is reparented and out of reach of the launcher's group."""


def tagged(tag: str) -> list[int]:
    """Pids of the live processes of this host whose environment carries ``TAG_VAR=tag``."""
    needle, found = f"{TAG_VAR}={tag}".encode(), []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            env = (d / "environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if needle in env.split(b"\0") and start_ticks(int(d.name)) is not None:
            found.append(int(d.name))
    return found


def stop_tagged(tag: str, sig: int = signal.SIGTERM, grace: float = 30.0, spare: Sequence[int] = ()) -> list[int]:
    """Stop every process carrying ``tag`` but ``spare`` (TERM, then KILL after ``grace`` s); the pids found."""
    pids = [p for p in tagged(tag) if p not in spare]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(start_ticks(p) is not None for p in pids):
        time.sleep(0.1)
    for pid in (p for p in tagged(tag) if p not in spare):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return pids


def _group_and_descendants(pid: int) -> list[Any]:
    import psutil

    try:
        root = psutil.Process(pid)
        procs = {root, *root.children(recursive=True)}
    except psutil.NoSuchProcess:
        procs = set()
    for p in psutil.process_iter(["pid"]):
        with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            if os.getpgid(p.pid) == pid:
                procs.add(p)
    return [p for p in procs if p.pid != os.getpid()]


def stop_tree(pid: int, sig: int = signal.SIGTERM, grace: float = 30.0) -> None:
    """Signal ``pid``'s process group and every descendant, wait ``grace`` s, then KILL what is left."""
    try:
        import psutil
    except ImportError:  # a bare core install: the group alone
        _stop_group(pid, sig, grace)
        return
    procs = _group_and_descendants(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(sig)
    _gone, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive + _group_and_descendants(pid):
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=10)


def _stop_group(pid: int, sig: int, grace: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and start_ticks(pid) is not None:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    """``python -m stoker.process stop-tagged TAG``: what a launcher runs on another node to stop what it
    started there (a trainer's ranks) before anything is relaunched, and what a trainer's supervising shell runs
    on its own host: after its launcher exited (ranks it orphaned), or when asked to stop (``--confirm``: the
    file that says so, written once everything is stopped)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m stoker.process")
    ap.add_argument("command", choices=["stop-tagged"])
    ap.add_argument("tag")
    ap.add_argument("--grace", type=float, default=30.0)
    ap.add_argument("--spare", type=int, action="append", default=[], help="a pid not to stop (the caller)")
    ap.add_argument("--confirm", type=Path, help="write {host, stopped, at} here once stopped")
    ns = ap.parse_args(argv)
    pids = stop_tagged(ns.tag, grace=ns.grace, spare=ns.spare)
    done = json.dumps({"host": socket.gethostname(), "stopped": pids, "at": time.time()})
    if ns.confirm is not None:
        tmp = ns.confirm.with_name(ns.confirm.name + ".tmp")
        tmp.write_text(done)
        os.replace(tmp, ns.confirm)
    print(done)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
