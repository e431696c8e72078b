"""A detached training process: launch, find again, and read its outcome from files.

Layout under the trainer's folder (one per run topic): ``trainer.pid``, ``trainer.log``,
``trainer.rc`` (written by the wrapping shell when the launcher exits), ``train_summary.json``,
``checkpoints/``. Everything is plain files so the Airflow worker that launched it, a triggerer
that follows it and a person with a shell all see the same state.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from stoker import paths


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TrainerProcess:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.pid_path = self.folder / "trainer.pid"
        self.log_path = self.folder / "trainer.log"
        self.rc_path = self.folder / "trainer.rc"

    def pid(self) -> int | None:
        try:
            return int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return None

    def running(self) -> bool:
        pid = self.pid()
        if pid is None or self.rc_path.exists():
            return False
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False
        return str(self.folder).encode() in cmdline

    def exit_code(self) -> int | None:
        try:
            return int(self.rc_path.read_text().strip())
        except (OSError, ValueError):
            return None

    def command(self, manifest_path: str, recipe: str, world_size: int, launcher: str,
                extra: list[str]) -> list[str]:
        script = str(paths.project_root() / "training" / "train.py")
        args = ["--manifest", manifest_path, "--out", str(self.folder), "--recipe", recipe, *extra]
        if launcher == "deepspeed":
            return [str(Path(sys.executable).parent / "deepspeed"), "--num_gpus", str(world_size),
                    "--master_port", str(_free_port()), script, *args]
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world_size),
                "--master_port", str(_free_port()), script, *args]

    def start(self, cmd: list[str], env: dict[str, str], world_size: int) -> int:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.rc_path.unlink(missing_ok=True)
        threads = max(1, (os.cpu_count() or 1) // world_size)
        full_env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1",
                    "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR",
                                                           str(paths.cache_dir() / "torch-extensions")),
                    **env}
        # the shell records the launcher's exit code; its argv names the folder so running() can check it
        shell = f"{shlex.join(cmd)}; echo $? > {shlex.quote(str(self.rc_path))}"
        with open(self.log_path, "ab") as log:
            proc = subprocess.Popen(["/bin/sh", "-c", shell, str(self.folder)], stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env,
                                    start_new_session=True, cwd=paths.project_root())
        self.pid_path.write_text(f"{proc.pid}\n")
        return proc.pid

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def describe(self, topic: str) -> dict[str, Any]:
        return {"folder": str(self.folder), "pid": self.pid(), "log": str(self.log_path),
                "rc_file": str(self.rc_path), "topic": topic}
