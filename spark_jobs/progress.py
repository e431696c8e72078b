"""The job's progress in its log (the Airflow task log): the stage advancing, not only Spark's INFO lines.

Every ``every`` seconds the driver logs one line: the phase, Spark's tasks done of the stage's total,
the input bytes read of the total, documents and tokens per second, and an ETA of the read. Tasks
report through accumulators, which Spark delivers as each task ends.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from stoker.files import atomic_write_json

log = logging.getLogger("stoker.tokenize_publish")


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


class JobProgress:
    def __init__(self, spark: Any, every: float = 15.0, out: Path | None = None, tick: float = 3.0) -> None:
        """Logs a line every ``every`` s; with ``out`` (the run's ``spark_progress.json``) also writes it there
        every ``tick`` s, where ``stoker refresh`` reads it."""
        sc = spark.sparkContext
        self._sc, self.every, self.out, self.tick = sc, every, out, min(tick, every)
        self.bytes_read, self.docs, self.tokens = sc.accumulator(0), sc.accumulator(0), sc.accumulator(0)
        self.total_bytes = 0
        self.phase = "starting"
        self._t0 = self._phase_t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stoker-progress", daemon=True)

    def __enter__(self) -> JobProgress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        line = f"done: {self.line()}"
        log.info("progress: %s", line)
        if self.out is not None:
            atomic_write_json(self.out, {"line": line, "at": time.time()})

    def set_phase(self, phase: str) -> None:
        """A new pass over the input: its bytes and documents count from zero (tokens run on)."""
        if self.phase != "starting":
            log.info("progress: %s", self.line())
        self.phase, self._phase_t0 = phase, time.monotonic()
        self.bytes_read.value, self.docs.value = 0, 0
        log.info("progress: %s", phase)

    def _tasks(self) -> str:
        tracker = self._sc.statusTracker()
        stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
        done = sum(s.numCompletedTasks for s in stages if s)
        total = sum(s.numTasks for s in stages if s)
        return f"tasks {done}/{total}" if total else "tasks -"

    def line(self) -> str:
        now = time.monotonic()
        elapsed, in_phase = max(now - self._t0, 1e-9), max(now - self._phase_t0, 1e-9)
        read, docs, tokens = self.bytes_read.value, self.docs.value, self.tokens.value
        eta = ""
        if self.total_bytes and 0 < read < self.total_bytes:
            eta = f", ETA {(self.total_bytes - read) / (read / in_phase):.0f} s"
        share = f" ({100 * read / self.total_bytes:.0f}%)" if self.total_bytes else ""
        return (f"{self.phase}: {self._tasks()}, read {_mb(read)} of {_mb(self.total_bytes)}{share}, "
                f"{docs:,} docs ({docs / in_phase:,.0f}/s), {tokens:,} tokens ({tokens / in_phase:,.0f}/s), "
                f"{in_phase:.0f} s in this pass, {elapsed:.0f} s in all{eta}")

    def _run(self) -> None:
        logged = time.monotonic()
        while not self._stop.wait(self.tick):
            try:
                line = self.line()
                if self.out is not None:
                    atomic_write_json(self.out, {"line": line, "at": time.time()})
                if time.monotonic() - logged >= self.every:
                    log.info("progress: %s", line)
                    logged = time.monotonic()
            except Exception:  # noqa: BLE001 - a progress line must never fail the job
                continue
