"""Per-step metrics: a JSONL log and TensorBoard event files (rank 0), and the loss-curve PNG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stoker.layout import TrainerFiles


class Metrics:
    def __init__(self, files: TrainerFiles, enabled: bool) -> None:
        self.enabled = enabled
        self.path = files.metrics
        self._writer: Any = None
        if enabled:
            files.folder.mkdir(parents=True, exist_ok=True)
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(files.tensorboard))
            self._file = open_log(self.path)

    def log(self, step: int, values: dict[str, float]) -> None:
        if not self.enabled:
            return
        self._file.write(json.dumps({"step": step, **values}) + "\n")
        self._file.flush()
        for k, v in values.items():
            self._writer.add_scalar(k, v, step)

    def close(self) -> None:
        if self.enabled:
            self._file.close()
            self._writer.close()


def open_log(path: Path) -> Any:
    """A per-step JSONL log opened to append. A killed trainer may have left a torn last line: the
    resumed one starts on a fresh line, so its first row is not glued to the torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a+b")  # noqa: SIM115 - the caller closes it
    if f.tell() > 0:
        f.seek(-1, 2)
        if f.read(1) != b"\n":
            f.write(b"\n")
    f.close()
    return open(path, "a", encoding="utf-8")  # noqa: SIM115 - the caller closes it


def counted_steps(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of the steps that count, in order. A trainer resumed from a checkpoint repeats the
    steps after it: a row whose step is not past the last one starts a new life, which replaces the
    earlier rows from that step on (the weights they led to were lost with the killed trainer)."""
    out: list[dict[str, Any]] = []
    for row in rows:
        while out and out[-1]["step"] >= row["step"]:
            out.pop()
        out.append(row)
    return out


def read_log(path: Path) -> list[dict[str, Any]]:
    """A JSONL per-step log; a torn line (a killed trainer) is skipped."""
    rows = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The metrics of the steps that count (:func:`counted_steps`); a torn line is skipped."""
    return counted_steps(read_log(path))


def trained_keys(files: TrainerFiles) -> list[str]:
    """Every sequence key the trained weights have seen, across ranks, from the keys logs
    (``train.log_keys``): each step's keys once, after restarts (:func:`counted_steps`)."""
    pattern = files.keys_log.name.replace("{rank}", "*")
    return [k for f in sorted(files.folder.glob(pattern)) for row in counted_steps(read_log(f)) for k in row["keys"]]


def plot_loss(rows: list[dict[str, Any]], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], lw=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("training loss")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out
