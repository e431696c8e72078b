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
import sys
from typing import Any

from stoker import paths
from stoker.layout import TrainerFiles
from stoker.manifest import Manifest

log = logging.getLogger("stoker.launcher")

TRAIN_MODULE = "training.train"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TrainerLauncher:
    def __init__(self, files: TrainerFiles) -> None:
        self.files = files

    def pid(self) -> int | None:
        return self.files.process.pid()

    def running(self) -> bool:
        """The launcher (and so its ranks' session) still runs and has not recorded an exit code."""
        return self.files.exit_code() is None and self.files.process.running()

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

    def command(self, manifest_path: str, recipe: str, world_size: int, launcher: str,
                extra: list[str]) -> list[str]:
        args = ["--manifest", manifest_path, "--out", str(self.files.folder), "--recipe", recipe, *extra]
        if launcher == "deepspeed":
            return [str(paths.venv_bin("deepspeed")), "--num_gpus", str(world_size),
                    "--master_port", str(_free_port()), "--module", TRAIN_MODULE, *args]
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world_size),
                "--master_port", str(_free_port()), "-m", TRAIN_MODULE, *args]

    def start(self, manifest: Manifest, cmd: list[str], env: dict[str, str], world_size: int) -> int:
        f = self.files
        f.folder.mkdir(parents=True, exist_ok=True)
        f.publication.write_text(manifest.publication + "\n")
        f.rc.unlink(missing_ok=True)
        threads = max(1, (os.cpu_count() or 1) // world_size)
        full_env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1",
                    "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR",
                                                           str(paths.cache_dir() / "torch-extensions")),
                    **env}
        # the shell records the launcher's exit code; it runs in a session of its own (the process
        # record's group), so stopping it stops the launcher and every rank
        shell = f"{shlex.join(cmd)}; echo $? > {shlex.quote(str(f.rc))}"
        proc = f.process.spawn(["/bin/sh", "-c", shell, str(f.folder)], log=f.log, env=full_env,
                               cwd=paths.project_root())
        return proc.pid

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.files.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def describe(self, topic: str) -> dict[str, Any]:
        f = self.files
        return {"folder": str(f.folder), "pid": self.pid(), "log": str(f.log), "rc_file": str(f.rc), "topic": topic}
