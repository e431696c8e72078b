"""The promotion gate in a DAG run: a sabotaged night (its learning rate x 100) trains, is evaluated against
the line's head on its held-out documents, and is held: the head stays on the blessed night, the next night
continues it, and the run's summary says held with the figures that stopped it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from trainer_tools import first_night  # tests/trainer_tools.py

from stoker.layout import LineLayout, RunLayout
from stoker.lines import head, plan
from stoker.manifest import read_manifest
from stoker.runs import render, summary

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
DAG_TEST = """
import json
from datetime import datetime, timezone
import dags.refresh_dags as m
run = m.refresh_sabotage.test(logical_date=datetime(2026, 12, 11, tzinfo=timezone.utc))
print("STATE=" + json.dumps(str(run.state)))
"""


def test_a_night_trained_at_100_times_the_learning_rate_is_held_and_the_head_stays(kafka_config, sample_corpus,
                                                                                 airflow_db, tmp_path):
    blessed = first_night(kafka_config, sample_corpus, tmp_path, "sabotage", "2026-12-10")
    corpora, drop = tmp_path / "corpora", tmp_path / "drop"
    (corpora / "recipes").mkdir(parents=True)
    (corpora / "recipes" / "hot.yaml").write_text("base: debug_cpu\nlr: 0.1\n")  # debug_cpu's 1e-3 x 100
    drop.mkdir()
    shutil.copy(sample_corpus["data"] / "part-00000.jsonl", drop)
    (drop / "_SUCCESS").write_text("")
    text = (REPO / "corpora" / "sample.yaml").read_text().replace("name: sample", "name: sabotage")
    for old, new in (('uri: "{state}/data/sample"', f'uri: "{drop}"'), ("recipe: debug_cpu", "recipe: hot"),
                     ("world_size: 2", "world_size: 1")):
        assert old in text, old
        text = text.replace(old, new)
    (corpora / "sabotage.yaml").write_text(text.replace("holdout_per_mille: 5", "holdout_per_mille: 20"))
    run = RunLayout.of("sabotage", "2026-12-11")
    shutil.rmtree(run.run_dir, ignore_errors=True)
    out = subprocess.run([sys.executable, "-c", DAG_TEST], cwd=REPO, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "STOKER_CORPORA": str(corpora)})
    assert 'STATE="success"' in out.stdout, out.stdout[-4000:] + out.stderr[-4000:]

    m = read_manifest(run.run_dir)
    figures = json.loads(run.evaluation.read_text())
    decision = figures["decision"]
    assert decision["decision"] == "held" and decision["by"] == "gate", decision
    assert [r["set"] for r in decision["regressions"]] == ["night"]
    assert figures["sets"]["night"]["all"]["docs"] == m.holdout["docs"] > 0
    line = LineLayout.of("sabotage")
    night = line.night("2026-12-11", "sabotage")
    assert json.loads(night.record.read_text())["decision"]["decision"] == "held"  # in the history...
    assert head(line)["ds"] == "2026-12-10"  # ...but the head stays on the blessed night
    nxt = plan(line, "2026-12-12", "sabotage", "random", "branch")
    assert (nxt.kind, nxt.path, nxt.role) == ("night", blessed, "head")
    text = render(summary(run.run_dir))
    assert "decision         held by gate: night:" in text and "change +" in text, text
