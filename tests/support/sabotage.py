"""The gate's sabotaged nights, as ``tests/e2e/test_sabotage.py`` runs one trial and ``bench/sabotage_bench.py``
(with the schedule and replay benches) run many: a corpus of the sample's shards, some corrupted, each night
through the DAG as the scheduler runs it."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

from stoker.layout import RunLayout

REPO = Path(__file__).resolve().parents[2]
CORPUS = "sabotage"
RECIPE = "base: debug_cpu\nwarmup_steps: 1\n"

DAG_RUN = """
import json, sys
from datetime import datetime, timezone
import dags.refresh_dags as m
run = getattr(m, "refresh_" + sys.argv[1]).test(logical_date=datetime.fromisoformat(sys.argv[2] + "T00:00:00+00:00"),
                                                 run_conf={"review": sys.argv[3]})
print("STATE=" + json.dumps(str(run.state)))
"""


def shuffled(text: str, rng: random.Random, unit: str) -> str:
    """``text`` with its characters (``unit`` "chars") or its whitespace-separated words ("words") shuffled."""
    parts = list(text) if unit == "chars" else text.split()
    rng.shuffle(parts)
    return ("" if unit == "chars" else " ").join(parts)


def write_drop(folder: Path, shard: Path, shuffle: str | None) -> None:
    """A night's drop: one shard of the sample, each document's characters or words shuffled if told (``shuffle``
    "chars" or "words"); bad records kept as they are."""
    folder.mkdir(parents=True)
    rng = random.Random(7)
    with shard.open("rb") as src, (folder / "part-00000.jsonl").open("wb") as out:
        for raw in src:  # bytes: the sample's invalid UTF-8 record passes through as it is
            try:
                doc = json.loads(raw)
            except ValueError:
                doc = None
            if shuffle and isinstance(doc, dict) and isinstance(doc.get("text"), str):
                raw = (json.dumps({**doc, "text": shuffled(doc["text"], rng, shuffle)})
                       + "\n").encode()
            out.write(raw)
    (folder / "_SUCCESS").write_text("")


def sabotage_corpora(root: Path, sample_data: Path, shards: dict[str, tuple[str, str | None]]) -> Path:
    """A corpora folder with corpus ``sabotage`` (the sample's config; 20 documents a thousand held out),
    reading ``<root>/drops/<ds>``, and its recipe; one drop per night: ``ds -> (shard, shuffle)``."""
    folder = root / "corpora"
    (folder / "recipes").mkdir(parents=True)
    (folder / "recipes" / f"{CORPUS}.yaml").write_text(RECIPE)
    for ds, (shard, shuffle) in shards.items():
        write_drop(root / "drops" / ds, sample_data / shard, shuffle)
    text = (REPO / "corpora" / "sample.yaml").read_text().replace("name: sample", f"name: {CORPUS}")
    for old, new in (('uri: "{state}/data/sample"', f'uri: "{root}/drops/{{ds}}"'),
                     ("recipe: debug_cpu", f"recipe: {CORPUS}"), ("holdout_per_mille: 5", "holdout_per_mille: 20")):
        assert old in text, old
        text = text.replace(old, new)
    (folder / f"{CORPUS}.yaml").write_text(text)
    return folder


def run_night(corpora: Path, ds: str, review: str = "hold") -> dict:
    """Night ``ds`` through the DAG, a held night decided by the run param ``review`` without asking; its run
    summary."""
    env = {**os.environ, "STOKER_CORPORA": str(corpora)}
    out = subprocess.run([sys.executable, "-c", DAG_RUN, CORPUS, ds, review], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=900)
    assert 'STATE="success"' in out.stdout, out.stdout[-5000:] + out.stderr[-5000:]
    return json.loads(RunLayout.of(CORPUS, ds).summary.read_text())
