"""A mixture night's plan: which published night of each corpus it trains, and how many rows of each (issue 35).

One file, written once before the night's first launch and read by every launch after, so a trainer killed and
relaunched (on another host, at another world size) deals the same night: the rows per component are decided here,
by :func:`stoker.lines.mixture.night_rows` over the manifests' sequences, never again by a trainer. This module is
the file's one writer; :func:`write_plan` checks, at the write:

* every component of ``mix.shares`` has a manifest, and every manifest a share;
* the manifests can be trained as one stream: the same ``seq_len``, record dtype, vocabulary and tokenizer
  (sha256) — a batch mixes their rows, so a difference would feed one corpus's ids to another's embedding;
* a plan already on disk is only ever rewritten with the same content (a relaunch); another mixture for the same
  night is refused, naming both, since its trainer's checkpoint counts rows of the old one.

It owns the night's claim too (:func:`claim_night`): each corpus's publication of a date can start a run of the
line's DAG, and exactly one of them trains the night.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from stoker.config.line import LineConfig
from stoker.exceptions import ConfigError, StokerError
from stoker.files import atomic_write_json
from stoker.lines.mixture import Mix, NightMix, night_rows
from stoker.run.manifest import Manifest, read_manifest

PLAN_VERSION = 1
_SAME = ("seq_len", "dtype", "vocab_size", "tokenizer_sha256")
"""What every component's manifest must share to be dealt into one batch."""


@dataclass(frozen=True, slots=True)
class MixPlan:
    mix: Mix
    """The mix trained: the line's, or at a deadline its published corpora's shares scaled up to sum to 1."""
    manifests: dict[str, str]
    """Component → its night's manifest.json."""
    night: NightMix
    missing: dict[str, str] = field(default_factory=dict)
    """Corpora of the line's mix the night trains without (``deadline.when_missing: train_rest``), and why."""
    topics: dict[str, str] = field(default_factory=dict)
    """Component → the topic its manifest named when the night was planned (empty in a plan of an earlier Stoker)."""

    def read_manifests(self) -> dict[str, Manifest]:
        """The components' manifests, each still the publication the night was planned over: a corpus re-published
        since (its run's manifest now names another topic) is refused, since the plan's rows count the old one."""
        read = {k: read_manifest(p) for k, p in self.manifests.items()}
        moved = {k: (self.topics[k], m.topic) for k, m in read.items() if self.topics.get(k, m.topic) != m.topic}
        if moved:
            raise StokerError("the mixture night was planned over other publications than its manifests now name: "
                              + "; ".join(f"{k} planned over {a}, {self.manifests[k]} now names {b}"
                                          for k, (a, b) in sorted(moved.items()))
                              + ". Its rows count the old topics: to train the new publications, remove the night's "
                              "plan and its trainer folder and clear the line's run")
        return read

    def to_dict(self) -> dict[str, Any]:
        mix = asdict(self.mix)
        mix["shares"] = dict(self.mix.shares)
        return {"version": PLAN_VERSION, "mix": mix, "manifests": dict(self.manifests), "night": asdict(self.night),
                "missing": dict(self.missing), "topics": dict(self.topics)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> MixPlan:
        if data.get("version") != PLAN_VERSION:
            raise StokerError(f"{where}: mix plan version {data.get('version')!r}, this Stoker reads {PLAN_VERSION}")
        return cls(mix=Mix(**data["mix"]), manifests=dict(data["manifests"]), night=NightMix(**data["night"]),
                   missing=dict(data.get("missing", {})), topics=dict(data.get("topics", {})))


def plan_mixture(mix: Mix, manifests: Mapping[str, str | Path], missing: Mapping[str, str] | None = None) -> MixPlan:
    """The night's rows per component over the manifests' sequences (checked as the module says)."""
    read = {k: read_manifest(p) for k, p in manifests.items()}
    absent, unshared = sorted(set(mix.shares) - set(read)), sorted(set(read) - set(mix.shares))
    if absent or unshared:
        raise ConfigError(f"mix.shares names {sorted(mix.shares)}, the night's manifests are of {sorted(read)}: "
                          f"{'no manifest for ' + str(absent) if absent else ''}"
                          f"{'; no share for ' + str(unshared) if unshared else ''}. Give every corpus of the "
                          "line a share, and train once each has published")
    first = next(iter(read))
    for key in _SAME:
        values = {k: getattr(m, key) for k, m in read.items()}
        if len(set(values.values())) > 1:
            raise ConfigError(f"the mixture's corpora differ in {key}: {values}. Their rows are dealt into the same "
                              f"batches, so they must be packed alike (as {first}'s is): re-publish the others with "
                              "its tokenizer and seq_len")
    night = night_rows(mix, {k: m.sequences for k, m in read.items()})
    return MixPlan(mix=mix, manifests={k: str(Path(p).resolve()) for k, p in manifests.items()}, night=night,
                   missing=dict(missing or {}), topics={k: m.topic for k, m in read.items()})


def write_plan(path: Path, plan: MixPlan) -> MixPlan:
    """Write ``plan`` at ``path`` once; the same plan again is a no-op, another is refused."""
    if path.is_file():
        old = read_plan(path)
        if old.to_dict() != plan.to_dict():
            raise StokerError(f"{path} already plans this night as {old.night.rows} over {old.manifests}; the new "
                              f"plan is {plan.night.rows} over {plan.manifests}. A trainer's checkpoint counts rows of "
                              "the first: remove the night's trainer folder and this file to train the new mixture")
        return old
    atomic_write_json(path, plan.to_dict())
    return plan


def read_plan(path: str | Path) -> MixPlan:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise StokerError(f"mix plan {path} cannot be read ({e}): write it with stoker.lines.mix_plan") from e
    return MixPlan.from_dict(data, str(path))


@dataclass(frozen=True, slots=True)
class Arrivals:
    """Whether a line's night can be planned now, from which of its corpora have published it."""

    ready: bool
    published: dict[str, float]
    """Corpus → when its night's manifest was written (epoch seconds)."""
    missing: list[str]
    deadline: float | None
    """When the line stops waiting for the missing (the first publication + ``deadline.after_s``)."""
    why: str


def arrivals(shares: Mapping[str, float], published: Mapping[str, float], now: float, after_s: float,
             when_missing: str) -> Arrivals:
    """The deadline rule: every corpus published, or the deadline passed and the line trains the rest (``train_rest``);
    else it waits, saying for whom and until when."""
    missing = sorted(k for k in shares if k not in published)
    have = {k: t for k, t in published.items() if k in shares}
    if not missing:
        return Arrivals(True, have, [], None, "every corpus of the mix has published the night")
    if not have:
        return Arrivals(False, have, missing, None, f"no corpus of the mix has published the night yet: {missing}")
    deadline = min(have.values()) + after_s
    if now < deadline:
        return Arrivals(False, have, missing, deadline, f"waiting for {missing} until the deadline "
                        f"({deadline - now:.0f} s left; deadline.after_s = {after_s:.0f} after the first publication)")
    if when_missing == "wait":
        return Arrivals(False, have, missing, deadline, f"{missing} missed the deadline by {now - deadline:.0f} s; "
                        "deadline.when_missing = wait: the night waits for them")
    return Arrivals(True, have, missing, deadline, f"{missing} missed the deadline by {now - deadline:.0f} s; "
                    f"deadline.when_missing = train_rest: the night trains {sorted(have)}")


def rest_of(mix: Mix, present: list[str]) -> Mix:
    """``mix`` over ``present`` only: their shares scaled up to sum to 1."""
    total = sum(mix.shares[k] for k in present)
    return replace(mix, shares={k: mix.shares[k] / total for k in sorted(present)})


def published_at(manifest: Manifest) -> float:
    from datetime import datetime

    return datetime.fromisoformat(manifest.created_at).timestamp() if manifest.created_at else 0.0


def plan_night(line: LineConfig, ds: str, now: float) -> tuple[Arrivals | None, MixPlan | None]:
    """The line's plan for night ``ds``: the one written before (a relaunch, a retry: a corpus that publishes
    later does not change it), or, once :func:`arrivals` says so, a new one over the corpora that published, written
    at :meth:`stoker.layout.LineLayout.mix_plan`. A corpus whose night kept no document counts as missing (it has no
    row to give) without holding the night. ``(arrivals, None)`` while the night waits."""
    from stoker.layout import LineLayout, RunLayout

    path = LineLayout.of(line.name).mix_plan(ds)
    if path.is_file():
        return None, read_plan(path)
    found = {k: RunLayout.of(k, ds).manifest for k in line.mix.shares}
    read = {k: read_manifest(p) for k, p in found.items() if p.is_file()}
    arr = arrivals(line.mix.shares, {k: published_at(m) for k, m in read.items()}, now, line.deadline.after_s,
                   line.deadline.when_missing)
    if not arr.ready:
        return arr, None
    missing = {k: f"not published by the deadline ({line.deadline.after_s} s after the first corpus)"
               for k in arr.missing}
    missing |= {k: "published no sequence (every document was dropped)" for k, m in read.items() if not m.sequences}
    present = sorted(k for k in read if k not in missing)
    if not present:
        return replace(arr, ready=False, why=f"no corpus has rows for the night: {missing}"), None
    mix = rest_of(line.mix, present) if missing else line.mix
    return arr, write_plan(path, plan_mixture(mix, {k: found[k] for k in present}, missing))


def lead_of(line: LineConfig, plan: MixPlan) -> str:
    """The component whose run folder holds the mixture night's trainer, evaluation and summary, and whose train
    settings it trains with: the line's ``lead``, or when the lead missed the night, the largest share present
    (ties: the first name)."""
    if line.lead in plan.manifests:
        return line.lead
    return min(plan.manifests, key=lambda k: (-plan.mix.shares[k], k))


def claim_night(line: str, ds: str, run_id: str) -> str | None:
    """Claim night ``ds`` of ``line`` for the Airflow run ``run_id``: None when it is this run's (claimed now, or
    before by this very run: a retry, a clear), else the run that claimed it first. The claim is made with an
    exclusive create, so two runs that ask at once cannot both win."""
    import os

    from stoker.layout import LineLayout

    path = LineLayout.of(line).mix_claim(ds)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        try:
            owner = str(json.loads(path.read_text())["run_id"])
        except (OSError, ValueError, KeyError) as e:
            raise StokerError(f"{path} does not say which run trains night {ds} ({e}): remove it, and clear the "
                              "plan task of the run that should train it") from e
        return None if owner == run_id else owner
    with os.fdopen(fd, "w") as f:
        json.dump({"run_id": run_id, "line": line, "ds": ds}, f)
    return None


def planned_lead(line: str, ds: str) -> str | None:
    """The lead component of night ``ds`` of mixture line ``line`` once it is planned (None before): its run
    folder is where the night's trainer, evaluation, stage timings and summary are."""
    from stoker import paths
    from stoker.config.line import lines_dir, load_line
    from stoker.layout import LineLayout

    path = LineLayout.of(line).mix_plan(ds)
    if not path.is_file():
        return None
    return lead_of(load_line(lines_dir(paths.corpora_dir()) / f"{line}.yaml"), read_plan(path))
