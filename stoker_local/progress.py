"""A quiet terminal for ``stoker refresh``: one live line per stage while Airflow works, then the summary.

Airflow's, Spark's and the trainer's own logs go to files (their paths are printed); the live line
is read from what the run leaves in its folder, the same files a person would look at: the stage
timings the tasks record, the manifest once published, and the trainer's per-step metrics. On a
terminal the line is redrawn in place; in a pipe (CI, ``make run | tee``) a line is printed when a
stage changes and every ``every`` seconds while training.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from stoker.layout import RunLayout
from stoker.run.manifest import read_manifest

STAGES = ("await_source", "tokenize_publish", "await_published", "train", "await_consumed", "evaluate", "report")
STAGE_TEXT = {
    "await_source": "waiting for the night's drop",
    "tokenize_publish": "Spark: read, validate, dedup, tokenise, pack, publish",
    "await_published": "checking Kafka holds the manifest's offsets",
    "train": "training",
    "await_consumed": "checking Kafka: the training group's lag is 0",
    "evaluate": "scoring the night and the model it continued on held-out data",
    "report": "writing the run summary",
}


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m:d}:{s:02d}"


def _si(x: float) -> str:
    for unit, div in (("M", 1e6), ("k", 1e3)):
        if x >= div:
            return f"{x / div:.1f}{unit}"
    return f"{x:.0f}"


def last_json_line(path: Path, tail: int = 8192) -> dict[str, Any] | None:
    """The last whole JSON line of a growing file (a torn last line is skipped)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - tail))
            lines = f.read().splitlines()
    except OSError:
        return None
    for raw in reversed(lines):
        try:
            return json.loads(raw)
        except ValueError:
            continue
    return None


@dataclass(slots=True)
class RunWatcher:
    """What a run started at ``since`` (epoch seconds) is doing now, read from its folder."""

    run: RunLayout
    since: float

    def current(self) -> tuple[str | None, bool]:
        """The latest stage started since ``since``, and whether it has ended."""
        try:
            timings = json.loads(self.run.timings.read_text())
        except (OSError, ValueError):
            return None, False
        started = [(row["start"], st) for st, row in timings.items()
                   if isinstance(row, dict) and row.get("start", 0) >= self.since]
        if not started:
            return None, False
        _start, stage = max(started)
        row = timings[stage]
        return stage, row.get("end", 0) >= row["start"]

    def published(self) -> str:
        try:
            m = read_manifest(self.run.manifest)
        except Exception:  # noqa: BLE001 - not written yet (or being replaced)
            return ""
        return (f"{m.docs_kept}/{m.docs_in} docs kept, {_si(m.tokens)} tokens, {m.sequences} sequences "
                f"-> {m.topic}")

    def training(self) -> str:
        try:
            m = read_manifest(self.run.manifest)
        except Exception:  # noqa: BLE001
            return ""
        files = self.run.trainer(m.topic)
        row = last_json_line(files.metrics)
        if not row:
            return self.starting(files)
        done = int(row.get("sequences_done", 0))
        rate = row.get("tokens_per_s", 0.0) / max(m.seq_len, 1)  # sequences per second
        eta = f"  ETA {_clock((m.sequences - done) / rate)}" if rate > 0 and done < m.sequences else ""
        return (f"step {row['step']}  loss {row['loss']:.3f}  {_si(row.get('tokens_per_s', 0))} tok/s  "
                f"{done}/{m.sequences} seq ({100 * done / max(m.sequences, 1):.0f}%){eta}")

    def spark(self) -> str:
        """The Spark job's own progress line (phase, tasks, bytes read of the total, docs/s, ETA)."""
        row = last_json_line(self.run.spark_progress)
        return f"Spark {row['line']}" if row and row.get("line") else ""

    @staticmethod
    def starting(files: Any, now: float | None = None) -> str:
        """The trainer's start-up phase and how long it has been in it (before its first step)."""
        try:
            phase = json.loads(files.phase.read_text())
        except (OSError, ValueError):
            return "launching the ranks (torchrun)" if files.process.path.exists() else "launching the trainer"
        spent = (time.time() if now is None else now) - float(phase.get("at", 0))
        return f"starting: {phase.get('phase')} ({spent:.0f} s)"

    def line(self, now: float) -> tuple[str, str]:
        """(stage key, display line)."""
        stage, ended = self.current()
        elapsed = _clock(now - self.since)
        if stage is None:
            return "start", f"[{elapsed}] starting Airflow"
        detail = STAGE_TEXT.get(stage, "")
        if stage == "await_published" or (stage == "tokenize_publish" and ended):
            detail = self.published() or detail
        elif stage == "tokenize_publish":
            detail = self.spark() or detail
        if stage == "train":
            detail = self.training() or detail
        state = "done" if ended else "..."
        return f"{stage}:{state}", f"[{elapsed}] {stage:<17}{state:<5} {detail}"


@dataclass(slots=True)
class LiveLine:
    """Redraws one line on a terminal; in a pipe prints a line per key change (and every ``every`` s)."""

    out: TextIO = field(default_factory=lambda: sys.stdout)
    every: float = 20.0
    _key: str = ""
    _printed_at: float = 0.0
    _width: int = 0

    def show(self, key: str, text: str, now: float) -> None:
        if self.out.isatty():
            if key.split(":")[0] != self._key.split(":")[0] and self._width:
                self.out.write("\n")  # a finished stage keeps its line
                self._width = 0
            pad = max(0, self._width - len(text))
            self.out.write("\r" + text + " " * pad)
            self._width = len(text)
        elif key != self._key or now - self._printed_at >= self.every:
            self.out.write(text + "\n")
            self._printed_at = now
        self._key = key
        self.out.flush()

    def close(self) -> None:
        if self.out.isatty() and self._width:
            self.out.write("\n")
            self.out.flush()
            self._width = 0

    def say(self, line: str) -> None:
        """A line of its own between redraws."""
        self.close()
        self.out.write(line + "\n")
        self.out.flush()


def follow(cmd: list[str], env: dict[str, str], log: Path, watcher: RunWatcher,
           live: LiveLine | None = None, poll: float = 1.0,
           clock: Callable[[], float] = time.time) -> int:
    """Run ``cmd`` with its output in ``log``, showing ``watcher``'s line until it exits."""
    live = live or LiveLine()
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            while proc.poll() is None:
                live.show(*watcher.line(clock()), clock())
                time.sleep(poll)
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait(timeout=30)
            raise
        finally:
            live.close()
    return proc.returncode


def log_tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
