"""``stoker gc``: a retention policy for what the state folder grows by every night, dry-run first.

* **Run folders** (``runs/<corpus>/<date>``: manifest, quarantine, the trainer's folder and its
  checkpoints): the newest ``keep_runs`` dates of each corpus stay. A run that may still be at work stays
  whatever its age: its trainer alive on this host or, by its heartbeat, on another, or its publication under
  way (a plan and no manifest, changed within ``PUBLISHING_S``).
* **Line nights' checkpoints** (model + optimizer state, the largest part): the ``keep_checkpoints``
  nights of each line that joined last keep theirs; an older night keeps its ``hf/`` export (the
  weights a branch starts from) and its record, and a night continued from it starts a fresh optimizer.
* **Line nights** (with ``keep_nights``): the older nights go entirely.

Never removed: a line's head (the night the next one continues), the night that joined last (its
join number is the line's count), a pending night (not decided yet) and a night holding a file named
``HOLD``. Nothing is removed without ``apply``; the dry run lists each path, why, and the bytes it frees (files
no other path links)."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from stoker import paths
from stoker.layout import LineLayout, NightFiles, RunLayout, TrainerFiles
from stoker.lines.ledger import PENDING, state
from stoker.lines.nights import same_night

HOLD = "HOLD"
"""A night folder holding a file of this name is never removed by ``stoker gc``."""


@dataclass(slots=True)
class Removal:
    path: str
    what: str
    """``run``, ``checkpoint`` or ``night``."""
    why: str
    bytes: int


def freed_bytes(*paths_: Path | str) -> int:
    """Bytes removing all of ``paths_`` frees: their files that no path outside them links (a run's
    checkpoint hard-linked into a line's night frees nothing alone, and all of it with the night)."""
    inside: dict[int, tuple[int, int]] = {}  # inode -> (links seen inside, size)
    nlink: dict[int, int] = {}
    for root, _dirs, files in (w for p in paths_ for w in os.walk(Path(p).resolve())):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            seen, _ = inside.get(st.st_ino, (0, st.st_size))
            inside[st.st_ino], nlink[st.st_ino] = (seen + 1, st.st_size), st.st_nlink
    return sum(size for ino, (seen, size) in inside.items() if seen >= nlink[ino])


TRAINER_GONE_S = 3600
"""A run whose trainer is recorded on another host stays until that trainer's heartbeat is this old: gc takes
no chances with a slow shared folder (the train task's watch decides in seconds, from two stale readings)."""
PUBLISHING_S = 6 * 3600
"""A run with a plan and no manifest whose plan or Spark progress changed this recently may still be publishing
(its Spark stage is at work, here or on a cluster): it stays."""


def _live(run_dir: Path, now: float | None = None) -> str:
    """Why the run may still be at work ("" when it is not): a trainer alive by its process record on this host
    or its heartbeat from another (one recorded elsewhere without a heartbeat cannot be told dead from here, so it
    stays too), or a publication under way."""
    from stoker.process import Heartbeat

    run = RunLayout(run_dir)
    for folder in (f for f in run.train_dir.glob("*") if f.is_dir()):
        files = TrainerFiles(folder)
        if files.process.running():
            return f"its trainer {folder.name} runs here"
        age = Heartbeat(files.heartbeat).age(now)
        if files.process.path.is_file() and (age is None or age < TRAINER_GONE_S):
            return f"its trainer {folder.name} may run on another host (heartbeat {age or 0:.0f} s old)"
    if run.plan.is_file() and not run.manifest.is_file():
        changed = max(p.stat().st_mtime for p in (run.plan, run.spark_progress) if p.is_file())
        if (time.time() if now is None else now) - changed < PUBLISHING_S:
            return "it may still be publishing (a plan and no manifest yet)"
    return ""


def _runs(keep_runs: int, root: Path) -> list[Removal]:
    out = []
    for corpus in sorted(p for p in root.glob("*") if p.is_dir()):
        dates = sorted((p for p in corpus.glob("*") if p.is_dir() and p.name[:4].isdigit()), key=lambda p: p.name)
        for run_dir in dates[:max(0, len(dates) - keep_runs)]:
            if _live(run_dir):
                continue
            out.append(Removal(str(run_dir), "run", f"older than the newest {keep_runs} runs of corpus {corpus.name}",
                               freed_bytes(run_dir)))
    return out


def _protected(rec: dict[str, Any], night: NightFiles, head: dict[str, Any] | None, last_seq: int) -> str:
    if same_night(rec, head):
        return "the line's head"
    if int(rec.get("seq", 0)) == last_seq:
        return "joined last"
    if state(rec) == PENDING:
        return "pending (not decided yet: a person may still promote it)"
    if (night.folder / HOLD).exists():
        return f"held ({HOLD})"
    return ""


def _nights(line: LineLayout, keep_checkpoints: int, keep_nights: int | None) -> list[Removal]:
    from stoker.lines.ledger import head
    from stoker.lines.nights import joined_nights

    nights = joined_nights(line)
    top, last_seq = head(line), max((int(r.get("seq", 0)) for r, _ in nights), default=0)
    out = []
    for i, (rec, night) in enumerate(reversed(nights)):  # newest join first
        if _protected(rec, night, top, last_seq):
            continue
        folder = night.folder.resolve()
        if keep_nights is not None and i >= keep_nights:
            out.append(Removal(str(night.folder), "night", f"older than the newest {keep_nights} nights of line "
                                                          f"{line.name}", freed_bytes(folder)))
        elif i >= keep_checkpoints and night.checkpoint.is_dir():
            out.append(Removal(str(night.checkpoint), "checkpoint", f"older than the newest {keep_checkpoints} "
                               f"nights of line {line.name} (its hf/ export stays)", freed_bytes(night.checkpoint)))
    return out


def removals(keep_runs: int = 14, keep_checkpoints: int = 3, keep_nights: int | None = None) -> list[Removal]:
    """What ``stoker gc`` would remove, removing nothing."""
    for name, value in (("--keep-runs", keep_runs), ("--keep-checkpoints", keep_checkpoints),
                        ("--keep-nights", keep_nights if keep_nights is not None else 1)):
        if value < 1:
            raise ValueError(f"{name} = {value}: must be >= 1 (the newest always stays)")
    out = _runs(keep_runs, paths.runs_dir())
    for folder in sorted(p for p in (paths.state_dir() / "lines").glob("*") if p.is_dir()):
        out += _nights(LineLayout(folder), keep_checkpoints, keep_nights)
    return out


def apply(removals: list[Removal]) -> None:
    """Remove what the removals list."""
    for r in removals:
        p = Path(r.path)
        if r.what == "night":  # the link in nights/ first: the line never lists a half-removed night
            target = p.resolve()
            p.unlink(missing_ok=True)
            shutil.rmtree(target, ignore_errors=True)
        else:
            shutil.rmtree(p, ignore_errors=True)


def render(removals: list[Removal], applied: bool) -> str:
    if not removals:
        return "nothing to remove under the retention policy"
    rows = [f"{'removed' if applied else 'would remove'} {r.what:<10} {r.bytes / 1e6:>9.1f} MB  {r.path}  ({r.why})"
            for r in removals]
    total = freed_bytes(*(r.path for r in removals)) / 1e6  # together: shared hard links count once freed
    tail = f"{total:,.1f} MB freed" if applied else f"{total:,.1f} MB would be freed: `stoker gc --apply` removes it"
    return "\n".join([*rows, tail])


def as_json(removals: list[Removal]) -> list[dict[str, Any]]:
    return [asdict(r) for r in removals]
