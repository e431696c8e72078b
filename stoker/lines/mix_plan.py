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
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

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
    manifests: dict[str, str]
    """Component → its night's manifest.json."""
    night: NightMix

    def read_manifests(self) -> dict[str, Manifest]:
        return {k: read_manifest(p) for k, p in self.manifests.items()}

    def to_dict(self) -> dict[str, Any]:
        mix = asdict(self.mix)
        mix["shares"] = dict(self.mix.shares)
        return {"version": PLAN_VERSION, "mix": mix, "manifests": dict(self.manifests), "night": asdict(self.night)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> MixPlan:
        if data.get("version") != PLAN_VERSION:
            raise StokerError(f"{where}: mix plan version {data.get('version')!r}, this Stoker reads {PLAN_VERSION}")
        return cls(mix=Mix(**data["mix"]), manifests=dict(data["manifests"]), night=NightMix(**data["night"]))


def plan_mixture(mix: Mix, manifests: dict[str, str | Path]) -> MixPlan:
    """The night's rows per component over the manifests' sequences (checked as the module says)."""
    read = {k: read_manifest(p) for k, p in manifests.items()}
    missing, unshared = sorted(set(mix.shares) - set(read)), sorted(set(read) - set(mix.shares))
    if missing or unshared:
        raise ConfigError(f"mix.shares names {sorted(mix.shares)}, the night's manifests are of {sorted(read)}: "
                          f"{'no manifest for ' + str(missing) if missing else ''}"
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
    return MixPlan(mix=mix, manifests={k: str(Path(p).resolve()) for k, p in manifests.items()}, night=night)


def write_plan(path: Path, plan: MixPlan) -> Path:
    """Write ``plan`` at ``path`` once; the same plan again is a no-op, another is refused."""
    if path.is_file():
        old = read_plan(path)
        if old.to_dict() != plan.to_dict():
            raise StokerError(f"{path} already plans this night as {old.night.rows} over {old.manifests}; the new "
                              f"plan is {plan.night.rows} over {plan.manifests}. A trainer's checkpoint counts rows of "
                              "the first: remove the night's trainer folder and this file to train the new mixture")
        return path
    atomic_write_json(path, plan.to_dict())
    return path


def read_plan(path: str | Path) -> MixPlan:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise StokerError(f"mix plan {path} cannot be read ({e}): write it with stoker.lines.mix_plan") from e
    return MixPlan.from_dict(data, str(path))
