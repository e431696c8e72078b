"""A detached training process: launch, find again, and read its outcome from files.

The trainer's folder and files are the run layout's (:class:`stoker.layout.TrainerFiles`): the
launcher's process record, its log, its exit code (written by the wrapping shell when the launcher
exits), the publication the trainer's state belongs to, and what the trainer itself writes.
Everything is plain files, so the Airflow worker that launched it, a triggerer that follows it and
a person with a shell all see the same state. No Airflow import here.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stoker import paths
from stoker.config.corpus import NODE_SHELL
from stoker.exceptions import StokerError
from stoker.layout import TrainerFiles
from stoker.process import HEARTBEAT_S, STOP_HEARTBEAT, TAG_VAR, Heartbeat, staleness, stop_tagged
from stoker.run.manifest import Manifest

log = logging.getLogger("stoker.launcher")

TRAIN_MODULE = "training.train"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(kw_only=True, slots=True)
class Placement:
    """Where the ranks run: ``nodes`` hosts (none: this machine), ``world_size`` ranks in all."""

    world_size: int
    launcher: str = "torchrun"
    nodes: list[str] = field(default_factory=list)
    node_shell: str = NODE_SHELL
    """How a command reaches another node (it runs there in the project folder, with the same paths)."""

    def remote(self, host: str, cmd: list[str], tag: str | None = None) -> list[str]:
        """``cmd`` on ``host``, its processes tagged ``tag`` there (see :func:`stoker.process.stop_tagged`)."""
        env = f"{REMOTE_ENV} {TAG_VAR}={shlex.quote(tag)}" if tag else REMOTE_ENV
        here = f"cd {shlex.quote(str(paths.project_root()))} && {env} {shlex.join(cmd)}"
        return [*shlex.split(self.node_shell.format(host=host)), here]

    def remote_hosts(self) -> list[str]:
        return [h for h in self.nodes if h not in LOCAL_HOSTS]


REMOTE_ENV = "env HF_HUB_OFFLINE=1"
"""Set on another node's launcher (the Kafka client config reaches it as a 0600 file: ``--secrets-file``)."""


def supervise(cmds: list[list[str]], rc_file: Path, heartbeat: Path | None = None,
              heartbeat_s: float = HEARTBEAT_S, files: TrainerFiles | None = None) -> str:
    """A bash script that runs the launchers, stops the others when one fails, and writes the first
    non-zero exit code (else 0) to ``rc_file``; meanwhile it beats ``heartbeat`` (a triggerer on
    another host judges the trainer by it).

    With the trainer's ``files`` it also answers for the trainer's processes on its own host, wherever the
    task that follows it runs: once the launchers exited it stops what they left there (ranks of a launcher
    killed alone run on in sessions of their own) before it writes the exit code, so an exit code means no
    process of the trainer runs on this host; and while they run it obeys a stop request
    (``files.stop_request``, written by a task on another host that must relaunch or give up the night): it
    stops every process of the trainer here and confirms it (``files.stop_confirmed``)."""
    rc = shlex.quote(str(rc_file))
    beat = Heartbeat(heartbeat).shell_loop(heartbeat_s) + " " if heartbeat is not None else ""
    stop = STOP_HEARTBEAT if heartbeat is not None else ""
    watch = after = ""
    if files is not None:
        stopper = [sys.executable, "-m", "stoker.process", "stop-tagged", str(files.folder)]
        watch = (f"( while kill -0 $$ 2>/dev/null; do if [ -e {shlex.quote(str(files.stop_request))} ]; then "
                 f"{shlex.join([*stopper, '--grace', str(STOP_GRACE_S), '--confirm', str(files.stop_confirmed)])}; "
                 f"exit 0; fi; sleep {heartbeat_s:g}; done ) & sw=$!; ")
        after = (f"kill $sw 2>/dev/null; wait $sw 2>/dev/null; "
                 f"{shlex.join([*stopper, '--grace', str(STOP_GRACE_S)])} --spare $$ >/dev/null 2>&1; ")
    if len(cmds) == 1:
        return f"{beat}{watch}{shlex.join(cmds[0])}; rc=$?; {stop}{after}echo $rc > {rc}"
    start = " ".join(f"{shlex.join(c)} & pids+=($!);" for c in cmds)
    return (f"{beat}{watch}pids=(); {start} rc=0; "
            "while [ ${#pids[@]} -gt 0 ]; do "
            "for i in ${!pids[@]}; do p=${pids[$i]}; kill -0 $p 2>/dev/null && continue; "
            "wait $p; r=$?; unset 'pids[i]'; "
            "if [ $r -ne 0 ] && [ $rc -eq 0 ]; then rc=$r; kill ${pids[@]} 2>/dev/null; fi; done; "
            f"[ ${{#pids[@]}} -gt 0 ] && sleep 0.5; done; {stop}{after}echo $rc > {rc}")


STOP_GRACE_S = 10
"""Seconds a trainer's processes get between TERM and KILL when its supervising shell stops them."""


class TrainerNotStopped(StokerError):
    """A trainer's processes on another host could not be confirmed stopped: nothing may be relaunched."""


class TrainerLauncher:
    def __init__(self, files: TrainerFiles) -> None:
        self.files = files

    def pid(self) -> int | None:
        return self.files.process.pid()

    def running(self) -> bool:
        """The launcher (and so its ranks' session) still runs and has not recorded an exit code: its pid
        on this host, its heartbeat when it runs on another (a retry there follows it, never starts a
        second trainer on the same checkpoints)."""
        return self.files.exit_code() is None and bool(self.files.process.alive(Heartbeat(self.files.heartbeat)))

    def where(self) -> str:
        """Where the followed trainer runs, in words: its pid on this host, else its host and heartbeat."""
        pid = self.pid()
        if pid is not None:
            return f"pid {pid}"
        beat = Heartbeat(self.files.heartbeat)
        data, age = beat.read() or {}, beat.age()
        return (f"on host {data.get('host', '?')}, pid {data.get('pid', '?')} there, last heartbeat "
                f"{age:.1f} s ago" if age is not None else "no pid on this host and no heartbeat")

    def adopt_or_reset(self, manifest: Manifest) -> None:
        """Trainer state of another publication of the topic (a re-run date recreates the topic under
        the same name) is garbage: its offsets mean nothing in the new data. Stop and remove it."""
        f = self.files
        try:
            owner = f.publication.read_text().strip()
        except OSError:
            owner = None
        if owner == manifest.publication or not f.folder.exists():
            return
        if f.process.elsewhere() or f.process.running():  # wherever it runs: it writes into this folder
            self.stop()
            log.info("stopped a trainer of an earlier publication of %s", manifest.topic)
        log.info("removing trainer state of an earlier publication of %s: %s", manifest.topic, f.folder)
        shutil.rmtree(f.folder)

    def command(self, manifest_path: str, plan_path: str, world_size: int, launcher: str,
                extra: list[str]) -> list[str]:
        """One node: ``torchrun --nproc_per_node W`` or ``deepspeed --num_gpus W``."""
        args = self._args(manifest_path, plan_path, extra)
        if launcher == "deepspeed":
            return [str(paths.venv_bin("deepspeed")), "--num_gpus", str(world_size),
                    "--master_port", str(_free_port()), "--module", TRAIN_MODULE, *args]
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world_size),
                "--master_port", str(_free_port()), "-m", TRAIN_MODULE, *args]

    def _args(self, manifest_path: str, plan_path: str, extra: list[str]) -> list[str]:
        """The trainer's own command line: the run's manifest and plan (which names the recipe and the line's
        settings), its folder, and the flags of this launch (the parent, the keys audit, secrets)."""
        return ["--manifest", manifest_path, "--plan", plan_path, "--out", str(self.files.folder), *extra]

    def commands(self, manifest_path: str, plan_path: str, placement: Placement,
                 extra: list[str]) -> list[list[str]]:
        """One command per launcher process. Several nodes: ``deepspeed --hostfile`` (one launcher that
        reaches the others itself, over pdsh/ssh), or one ``torchrun`` per node joining a c10d rendezvous
        on the first node (run there through ``placement.node_shell`` unless the node is this machine)."""
        if len(placement.nodes) <= 1:
            return [self.command(manifest_path, plan_path, placement.world_size, placement.launcher, extra)]
        args = self._args(manifest_path, plan_path, extra)
        per_node = placement.world_size // len(placement.nodes)
        if placement.launcher == "deepspeed":
            hostfile = self.files.folder / "hostfile"
            hostfile.parent.mkdir(parents=True, exist_ok=True)
            hostfile.write_text("".join(f"{h} slots={per_node}\n" for h in placement.nodes))
            return [[str(paths.venv_bin("deepspeed")), "--hostfile", str(hostfile), "--master_addr",
                     placement.nodes[0], "--master_port", str(_free_port()), "--module", TRAIN_MODULE, *args]]
        endpoint = f"{placement.nodes[0]}:{_free_port()}"
        run = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(placement.nodes)),
               "--nproc_per_node", str(per_node), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
               "--rdzv-id", self.files.folder.name, "-m", TRAIN_MODULE, *args]
        tag = str(self.files.folder)
        return [run if host in LOCAL_HOSTS else placement.remote(host, run, tag) for host in placement.nodes]

    def stop(self, placement: Placement | None = None, grace: float = 30.0) -> list[int]:
        """Stop every process of this trainer: the launcher's group and descendants, the ranks that left
        it (torch elastic gives each rank a session of its own, so a killed launcher orphans them: they
        carry the trainer's tag), and what runs on the other nodes. Before any relaunch, and when the
        train task fails for good: two trainers on one checkpoint folder and group must never run. A trainer
        launched on another host is stopped there (:meth:`stop_elsewhere`); TrainerNotStopped when that cannot
        be confirmed (its record is kept)."""
        if self.files.process.elsewhere():
            self.stop_elsewhere(grace)
        self.files.process.stop(grace=grace)
        stopped = stop_tagged(str(self.files.folder), grace=grace)
        if placement is not None:
            for host in placement.remote_hosts():
                self._stop_remote(placement, host, grace)
        if stopped:
            log.info("stopped %d processes of trainer %s that had left its launcher: %s", len(stopped),
                     self.files.folder, stopped)
        return stopped

    def stop_elsewhere(self, grace: float = 30.0, window: float | None = None) -> str:
        """Stop a trainer whose launcher runs on another host, through its supervising shell there; how it was
        confirmed. Confirmed by its exit code (the shell stopped its host's processes before writing it), by
        its confirmation of a stop request written here, or by a heartbeat silent for the whole ``window``
        (default: two stalenesses, the shell's grace and a beat, 30 s; a host that cannot beat into the shared
        folder for that long is lost, and cannot write the trainer's checkpoints there either). Else (it still
        beats and does not answer: an older supervisor, a hung shell) TrainerNotStopped, the record kept, nothing
        relaunched."""
        f, host = self.files, self.files.process.host()
        if f.exit_code() is None:
            f.stop_confirmed.unlink(missing_ok=True)
            f.stop_request.write_text(json.dumps({"by": socket.gethostname(), "at": time.time()}) + "\n")
            beat = Heartbeat(f.heartbeat)
            before = beat.read()
            limit = window if window is not None else 2 * staleness() + STOP_GRACE_S + HEARTBEAT_S
            deadline = time.monotonic() + limit
            while not f.stop_confirmed.is_file() and f.exit_code() is None and time.monotonic() < deadline:
                time.sleep(0.5)
            if f.stop_confirmed.is_file():
                how = f"confirmed by host {host}: {f.stop_confirmed.read_text().strip()}"
            elif f.exit_code() is not None:
                how = f"its launcher on {host} exited (code {f.exit_code()})"
            elif (beat.read() or {}).get("beat") == (before or {}).get("beat"):
                how = f"host {host} is lost: its heartbeat did not move in {limit:.0f} s"
            else:
                raise TrainerNotStopped(
                    f"trainer {f.folder} runs on host {host}, which still beats ({f.heartbeat}) and did not confirm "
                    f"the stop requested {limit:.0f} s ago ({f.stop_request}): nothing is relaunched while it may "
                    f"train. Stop it on {host} (`python -m stoker.process stop-tagged {f.folder}`), then clear the "
                    "task")
        else:
            how = f"its launcher on {host} exited (code {f.exit_code()})"
        log.warning("trainer %s on host %s stopped: %s", f.folder, host, how)
        f.process.clear()
        f.stop_request.unlink(missing_ok=True)
        return how

    def _stop_remote(self, placement: Placement, host: str, grace: float) -> None:
        tag = str(self.files.folder)
        cmd = placement.remote(host, [sys.executable, "-m", "stoker.process", "stop-tagged", tag, "--grace",
                                      str(grace)])
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=grace + 60, stdin=subprocess.DEVNULL)
            log.info("stopped on %s: %s", host, res.stdout.strip() or res.stderr.strip()[-500:])
        except (OSError, subprocess.TimeoutExpired) as e:
            log.warning("could not reach %s to stop the trainer's processes there: %s", host, e)

    def start(self, manifest: Manifest, cmd: list[str] | list[list[str]], env: dict[str, str],
              world_size: int) -> int:
        f = self.files
        f.folder.mkdir(parents=True, exist_ok=True)
        f.publication.write_text(manifest.publication + "\n")
        f.rc.unlink(missing_ok=True)
        f.phase.unlink(missing_ok=True)  # an earlier life's start-up phase is not this one's
        f.evaluation.unlink(missing_ok=True)  # nor its scores (of an export this life replaces)
        cmds: list[list[str]] = cmd if cmd and isinstance(cmd[0], list) else [cmd]  # type: ignore[list-item]
        threads = max(1, (os.cpu_count() or 1) // world_size)
        full_env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1",
                    TAG_VAR: str(f.folder), **paths.torch_build_env(), **env}
        # the shell records the launchers' exit code; it runs in a session of its own (the process
        # record's group), so stopping it stops every launcher and every rank
        f.heartbeat.unlink(missing_ok=True)  # an earlier life's beats are not this one's
        f.stop_request.unlink(missing_ok=True)  # a request to stop an earlier life is not one to stop this one
        f.stop_confirmed.unlink(missing_ok=True)
        proc = f.process.spawn(["/bin/bash", "-c", supervise(cmds, f.rc, f.heartbeat, files=f), str(f.folder)],
                               log=f.log,
                               env=full_env, cwd=paths.project_root())
        return proc.pid

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.files.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def describe(self, topic: str) -> dict[str, Any]:
        f = self.files
        return {"folder": str(f.folder), "pid": self.pid(), "log": str(f.log), "rc_file": str(f.rc), "topic": topic}
