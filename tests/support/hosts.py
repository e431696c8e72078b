"""Separate hosts on one Linux machine, each a set of namespaces made by ``unshare(1)`` (as root):

* its own hostname (UTS): ``socket.gethostname()``, Airflow's recorded hostname and a trainer's
  process record name it;
* its own PID space: its processes see only each other (``/proc`` is mounted again), a pid of another
  host means nothing here, and killing the host's init kills every process of it at once, as a lost
  machine does: no handler runs, no exit code is written;
* its own mounts: a private disk (``disks/<name>`` outside) appears at the same path on every host
  (``local/``), so each host's Airflow home, task logs and temporary files are its own; and
  ``/etc/hosts`` names every host.

The hosts share the network (127.0.0.1, as one flat network would) and the shared folder: what a
cluster mounts over NFS or Lustre at one path on every host (Stoker's state folder: run folders, the
trainer's folder, checkpoints and model lines).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil


def hosts_file(path: Path, names: list[str]) -> Path:
    path.write_text("127.0.0.1 localhost\n" + "".join(f"127.0.0.1 {n}\n" for n in names))
    return path


@dataclass
class Host:
    """One simulated machine running ``commands`` (name -> argv) under ``env``, each command's output
    in ``<private disk>/logs/<name>.log``."""

    name: str
    root: Path
    commands: dict[str, list[str]]
    env: dict[str, str]
    proc: subprocess.Popen | None = None
    init: int | None = None
    pid_ns: str = ""
    lost_at: float | None = None
    started: list[str] = field(default_factory=list)
    keep_alive: bool = False
    """The host outlives its commands (its init waits on a sleep too): a test that kills one process of it (a
    Celery worker) keeps the others running, as a machine does; else the host ends with its last command."""

    @property
    def disk(self) -> Path:
        """The host's private disk, seen from outside (as one reads a dead machine's disk)."""
        return self.root / "disks" / self.name

    @property
    def local(self) -> Path:
        """Where every host sees its own private disk."""
        return self.root / "local"

    def script(self) -> str:
        local = shlex.quote(str(self.local))
        lines = ["set -e", f"hostname {shlex.quote(self.name)}",
                 f"mount --bind {shlex.quote(str(self.disk))} {local}",
                 f"mount --bind {shlex.quote(str(self.root / 'hosts'))} /etc/hosts", "set +e"]
        for name, cmd in self.commands.items():
            lines.append(f"{shlex.join(cmd)} > {local}/logs/{shlex.quote(name)}.log 2>&1 &")
        if self.keep_alive:
            lines.append("sleep infinity &")
        return "\n".join([*lines, "wait"])

    def start(self) -> Host:
        for sub in ("logs", "tmp", "airflow"):
            (self.disk / sub).mkdir(parents=True, exist_ok=True)
        self.local.mkdir(parents=True, exist_ok=True)
        with open(self.disk / "host.log", "ab") as out:
            self.proc = subprocess.Popen(
                ["unshare", "--uts", "--pid", "--mount", "--fork", "--mount-proc", "--kill-child", "--",
                 "/bin/bash", "-c", self.script()],
                env=self.env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 30
        while not self.init:
            kids = psutil.Process(self.proc.pid).children()
            assert self.proc.poll() is None, f"host {self.name} did not start: {(self.disk / 'host.log').read_text()}"
            if kids:
                self.init = kids[0].pid
                self.pid_ns = os.readlink(f"/proc/{self.init}/ns/pid")
            assert time.monotonic() < deadline, f"host {self.name}: no init process in 30 s"
            time.sleep(0.05)
        self.started = list(self.commands)
        return self

    def pids(self) -> list[int]:
        """Every live process of this host (as pids outside its namespace)."""
        out = []
        for pid in psutil.pids():
            try:
                if os.readlink(f"/proc/{pid}/ns/pid") == self.pid_ns and psutil.Process(pid).status() != "zombie":
                    out.append(pid)
            except (OSError, psutil.Error):
                continue
        return out

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def lose(self, timeout: float = 30) -> float:
        """The machine is gone: SIGKILL its init; the kernel kills every process of its PID space. The
        time it happened."""
        assert self.init is not None
        self.lost_at = time.time()
        os.kill(self.init, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while self.pids():
            assert time.monotonic() < deadline, f"host {self.name}: processes outlived its init: {self.pids()}"
            time.sleep(0.1)
        if self.proc is not None:
            self.proc.wait(timeout=timeout)
        return self.lost_at

    def stop(self) -> None:
        if self.alive():
            self.lose()

    def log_tail(self, name: str, n: int = 60) -> str:
        try:
            return "\n".join((self.disk / "logs" / f"{name}.log").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"
