"""The gate against sabotaged nights, through the DAG as the scheduler runs it. A line's first night trains on
one shard of the sample (clean; its held-out documents kept with the night). Then:

* a night whose drop is the same text with every document's characters shuffled (a corrupted export):
  better on its own (scrambled) held-out text, worse on the first night's: held by its forgetting set.
  (Shuffled *words* are no sure sabotage on a line this young: the model still learns mostly which tokens
  are frequent, and a night of shuffled words improved the first night's figure, -0.16 bits per byte;
  BENCHMARKS.md, "The gate against sabotage");
* a clean night trained at 100 x the recipe's learning rate from its first step: held by its own set, and it
  continued the first night, not the held one.

The line's head stays on the first night throughout. `make bench` runs ten trials of each
(bench/sabotage_bench.py); this is one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stoker.layout import LineLayout, RunLayout
from stoker.lines import ledger
from tests.support.sabotage import CORPUS, RECIPE, run_night, sabotage_corpora

pytestmark = pytest.mark.e2e
CLEAN, SHUFFLED, HOT = "2026-11-10", "2026-11-11", "2026-11-12"


def test_a_night_of_scrambled_text_and_a_night_at_100x_the_learning_rate_are_held_and_the_head_stays(
        tmp_path, kafka_config, sample_corpus, airflow_db, capsys):
    line = LineLayout.of(CORPUS)
    shutil.rmtree(line.folder, ignore_errors=True)
    for ds in (CLEAN, SHUFFLED, HOT):
        shutil.rmtree(RunLayout.of(CORPUS, ds).run_dir, ignore_errors=True)
    corpora = sabotage_corpora(tmp_path, sample_corpus["data"], {
        CLEAN: ("part-00002.jsonl", None), SHUFFLED: ("part-00000.jsonl", "chars"), HOT: ("part-00000.jsonl", None)})

    first = run_night(corpora, CLEAN)
    assert first["eval"]["decision"]["decision"] == "promoted"
    head = ledger.head(line)
    assert head is not None and head["ds"] == CLEAN

    shuffled = run_night(corpora, SHUFFLED)
    decision = shuffled["eval"]["decision"]
    assert decision["decision"] == "held", decision
    stopped = {r["set"]: r for r in decision["regressions"]}
    assert f"forgetting:{CLEAN}.{CORPUS}" in stopped, decision  # what the night cost the first night's data
    assert stopped[f"forgetting:{CLEAN}.{CORPUS}"]["change"] > stopped[f"forgetting:{CLEAN}.{CORPUS}"]["allowed"]
    assert ledger.head(line)["ds"] == CLEAN  # the head stays
    held = json.loads(line.night(SHUFFLED, CORPUS).record.read_text())
    assert held["decision"]["decision"] == "held" and "Decision: **held** by gate" in line.night(
        SHUFFLED, CORPUS).card.read_text()

    (corpora / "recipes" / f"{CORPUS}.yaml").write_text(RECIPE + "lr: 0.1\n")  # 100 x debug_cpu's 1e-3
    with_tasks(corpora / f"{CORPUS}.yaml")  # lm-eval tasks too: beside the gate's figures, not in the gate
    hot = run_night(corpora, HOT, review="roll-back")  # the review step decides without asking
    decision = hot["eval"]["decision"]
    assert decision["decision"] == "held", decision
    assert "night" in {r["set"] for r in decision["regressions"]}, decision
    # it continued the blessed head (the first night), not the held one
    record = json.loads(line.night(HOT, CORPUS).record.read_text())
    assert (record["parent"]["ds"], record["parent"]["role"]) == (CLEAN, "head"), record["parent"]
    assert hot["eval"]["baseline"] == f"{line.night(CLEAN, CORPUS).folder}/hf"
    assert ledger.head(line)["ds"] == CLEAN
    # what `stoker runs show --json` carries: the decision and the figures that stopped it
    cli = subprocess.run([sys.executable, "-m", "stoker_local.cli", "runs", "show", f"{CORPUS}/{HOT}", "--json"],
                         capture_output=True, text=True, check=True, env={**os.environ, "STOKER_CORPORA": str(corpora)})
    shown = json.loads(cli.stdout)["eval"]
    assert shown["decision"]["decision"] == "held" and shown["decision"]["regressions"]
    assert shown["sets"]["night"]["all"]["delta"] > 0
    record = json.loads(line.night(HOT, CORPUS).record.read_text())  # the run param's roll-back, the gate's hold kept
    assert record["decision"]["decision"] == "rolled_back" and "eval.review (roll-back)" in record["decision"]["by"]
    assert record["decision"]["previous"]["decision"] == "held"
    cloze = shown["lm_eval"]["tasks"]["stoker_cloze"]
    assert cloze["docs"] == 16 and {"value", "stderr", "baseline"} <= set(cloze["metrics"]["acc"])
    assert "| stoker_cloze | acc | 16 |" in line.night(HOT, CORPUS).card.read_text()
    overrule_from_a_terminal(line, capsys)


def with_tasks(corpus_yaml: Path) -> None:
    """``eval.lm_eval_tasks``: Stoker's own local task (corpora/examples/lm_eval), 16 of its documents."""
    text = corpus_yaml.read_text()
    assert "  holdout_per_mille: 20" in text
    tasks = ('\n  lm_eval_tasks: [stoker_cloze]\n  lm_eval_include: "{project}/corpora/examples/lm_eval"'
             '\n  lm_eval_limit: 16')
    corpus_yaml.write_text(text.replace("  holdout_per_mille: 20", "  holdout_per_mille: 20" + tasks, 1))


def overrule_from_a_terminal(line: LineLayout, capsys) -> None:
    """`stoker refresh --decision` applies a decision to a night the gate held (never a question on the
    terminal); `stoker lines decide` promotes a held night or rolls the head back later."""
    from stoker_local.refresh import apply_decision

    apply_decision(RunLayout.of(CORPUS, SHUFFLED), "hold")
    assert f"stoker lines decide {CORPUS} {SHUFFLED}.{CORPUS} promote" in capsys.readouterr().out
    apply_decision(RunLayout.of(CORPUS, HOT), "roll-back")  # the run's review step decided it already: not again
    assert "is now rolled_back" in capsys.readouterr().out
    assert "previous" not in json.loads(line.night(HOT, CORPUS).record.read_text())["decision"]["previous"]
    apply_decision(RunLayout.of(CORPUS, SHUFFLED), "roll-back")
    record = json.loads(line.night(SHUFFLED, CORPUS).record.read_text())
    assert record["decision"]["decision"] == "rolled_back" and "--decision roll-back" in record["decision"]["by"]

    def stoker(*args: str) -> str:
        return subprocess.run([sys.executable, "-m", "stoker_local.cli", *args], capture_output=True, text=True,
                              check=True, env=os.environ.copy()).stdout

    stoker("lines", "decide", CORPUS, f"{SHUFFLED}.{CORPUS}", "promote", "--why", "the shuffle was intended")
    assert ledger.head(line)["ds"] == SHUFFLED
    assert "the shuffle was intended" in line.night(SHUFFLED, CORPUS).card.read_text()
    stoker("lines", "decide", CORPUS, SHUFFLED, "roll-back")
    assert ledger.head(line)["ds"] == CLEAN
