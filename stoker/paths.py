"""Where Stoker keeps things.

* Run state (broker data, Airflow home, runs, checkpoints) lives in one git-ignored folder
  inside the checkout: ``$STOKER_HOME``, by default ``<repo>/.stoker``.
* Heavy downloads that do not depend on the checkout (Kafka's jars) are cached per user in
  ``$STOKER_CACHE``, by default ``~/.cache/stoker``, so a fresh clone reuses them.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def project_root() -> Path:
    """The checkout (corpora/, dags/, spark_jobs/ live here); ``$STOKER_PROJECT`` overrides."""
    return Path(os.environ.get("STOKER_PROJECT", REPO_ROOT)).resolve()


def state_dir() -> Path:
    """The git-ignored run-state folder."""
    return Path(os.environ.get("STOKER_HOME", project_root() / ".stoker")).resolve()


def cache_dir() -> Path:
    """Per-user cache of checkout-independent downloads."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "stoker"
    return Path(os.environ.get("STOKER_CACHE", default)).resolve()


def torch_extensions_dir() -> Path:
    """Where torch JIT-builds DeepSpeed's ops (``$TORCH_EXTENSIONS_DIR`` when set): per user and per Python
    environment. The build commands name the environment's include paths, so two checkouts sharing one
    folder rebuild each other's ops (30-45 s at a trainer's first start) each time they take turns."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(os.environ["TORCH_EXTENSIONS_DIR"])
    env = hashlib.sha256(os.path.realpath(sys.prefix).encode()).hexdigest()[:12]
    return cache_dir() / "torch-extensions" / env


def torch_build_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The variables a trainer needs so that DeepSpeed's JIT-built ops are built once and then reused:
    the cache folder above, and ``PATH`` starting with this Python environment's own ``bin`` (its ``ninja``).
    Two ninja versions hash a build's command differently (1.11 and 1.13 do), so a trainer started with the
    system's ninja and the next with the environment's rebuilt each other's ops (30-50 s) each time."""
    path = (os.environ if base is None else base).get("PATH", os.defpath)
    env_bin = str(Path(sys.executable).absolute().parent)  # absolute: torch runs ninja in the build folder
    rest = [p for p in path.split(os.pathsep) if p and p != env_bin]
    return {"TORCH_EXTENSIONS_DIR": str(torch_extensions_dir()), "PATH": os.pathsep.join([env_bin, *rest])}


def runs_dir() -> Path:
    return state_dir() / "runs"


def corpora_dir() -> Path:
    return Path(os.environ.get("STOKER_CORPORA", project_root() / "corpora")).resolve()


def expand(path: str) -> str:
    """Replace ``{state}`` (the state folder) and ``{project}`` (the checkout) in a configured path."""
    return path.replace("{state}", str(state_dir())).replace("{project}", str(project_root()))


def resolve_local(path: str | Path) -> Path:
    """A relative local path is relative to the project root, never to the CWD; ``file://`` and
    ``{state}``/``{project}`` are understood."""
    p = Path(expand(str(path)).removeprefix("file://")).expanduser()
    return p if p.is_absolute() else (project_root() / p)


def venv_bin(name: str) -> Path:
    """A console script of the Python environment this process runs in (deepspeed, airflow, ...)."""
    import sys

    return Path(sys.executable).parent / name


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read, from its creation on (it holds a secret)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def load_private_env(path: str) -> None:
    """Put a secrets file's entries (a JSON object: ``STOKER_KAFKA_CONFIG``, ``AWS_*``) in this process's
    environment. A path that is not there is looked for by name in the working folder, where YARN
    puts what ``spark-submit --files`` ships in cluster mode."""
    import json

    f = Path(path)
    if not f.is_file():
        f = Path.cwd() / f.name
    if not f.is_file():
        raise FileNotFoundError(f"secrets file {path}: not there, nor {f}: ship it with spark-submit --files")
    os.environ.update({str(k): str(v) for k, v in json.loads(f.read_text()).items()})
