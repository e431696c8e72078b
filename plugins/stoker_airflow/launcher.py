"""A detached training process: launch, find again, and read its outcome from files.

The trainer's folder and files are the run layout's (:class:`stoker.layout.TrainerFiles`): the
launcher's process record, its log, its exit code (written by the wrapping shell when the launcher
exits), the publication the trainer's state belongs to, and what the trainer itself writes.
Everything is plain files, so the Airflow worker that launched it, a triggerer that follows it and
a person with a shell all see the same state. No Airflow import here.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stoker import paths
from stoker.config.corpus import NODE_SHELL
from stoker.layout import TrainerFiles
from stoker.process import HEARTBEAT_S, STOP_HEARTBEAT, TAG_VAR, Heartbeat, stop_tagged
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
              heartbeat_s: float = HEARTBEAT_S) -> str:
    """A bash script that runs the launchers, stops the others when one fails, and writes the first
    non-zero exit code (else 0) to ``rc_file``; meanwhile it beats ``heartbeat`` (a triggerer on
    another host judges the trainer by it)."""
    rc = shlex.quote(str(rc_file))
    beat = Heartbeat(heartbeat).shell_loop(heartbeat_s) + " " if heartbeat is not None else ""
    stop = STOP_HEARTBEAT if heartbeat is not None else ""
    if len(cmds) == 1:
        return f"{beat}{shlex.join(cmds[0])}; rc=$?; {stop}echo $rc > {rc}"
    start = " ".join(f"{shlex.join(c)} & pids+=($!);" for c in cmds)
    return (f"{beat}pids=(); {start} rc=0; "
            "while [ ${#pids[@]} -gt 0 ]; do "
            "for i in ${!pids[@]}; do p=${pids[$i]}; kill -0 $p 2>/dev/null && continue; "
            "wait $p; r=$?; unset 'pids[i]'; "
            "if [ $r -ne 0 ] && [ $rc -eq 0 ]; then rc=$r; kill ${pids[@]} 2>/dev/null; fi; done; "
            f"[ ${{#pids[@]}} -gt 0 ] && sleep 0.5; done; {stop}echo $rc > {rc}")


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
        if f.process.stop():
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
        train task fails for good: two trainers on one checkpoint folder and group must never run."""
        self.files.process.stop(grace=grace)
        stopped = stop_tagged(str(self.files.folder), grace=grace)
        if placement is not None:
            for host in placement.remote_hosts():
                self._stop_remote(placement, host, grace)
        if stopped:
            log.info("stopped %d processes of trainer %s that had left its launcher: %s", len(stopped),
                     self.files.folder, stopped)
        return stopped

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
        proc = f.process.spawn(["/bin/bash", "-c", supervise(cmds, f.rc, f.heartbeat), str(f.folder)], log=f.log,
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
