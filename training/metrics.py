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
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

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


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The JSONL log; a torn last line (a killed trainer) is skipped."""
    rows = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


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
