"""A mixture line's DAG as Airflow runs it (issue 35): three corpora of one line at 0.6/0.3/0.1, their nights
published to the real broker, and ``dag.test()`` of ``line_<name>``: the night is claimed and planned, trained from
the three topics in one trainer, scored on every corpus's held-out documents, decided by the line's gate and
reported with its realised shares. The corpora's own DAGs publish only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stoker.layout import LineLayout, RunLayout
from tests.support.trainer_tools import publish_text_run, write_plan

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
LINE, DS = "mixline", "2026-12-03"
SHARES = {"web": 0.6, "code": 0.3, "papers": 0.1}
ROWS = {"web": 60, "code": 25, "papers": 5}
"""Each corpus's published sequences: web trains whole; code and papers repeat up to the cap of 2."""
LINE_YAML = """
description: web, code and papers at 0.6/0.3/0.1
mix:
  shares: {web: 0.6, code: 0.3, papers: 0.1}
  when_short: repeat
  max_repeats: 2
deadline:
  after_s: 0
"""


def _corpora(tmp_path: Path) -> Path:
    folder = tmp_path / "corpora"
    (folder / "lines").mkdir(parents=True)
    text = (REPO / "corpora" / "sample.yaml").read_text()
    assert "\ntrain:\n" in text and "name: sample" in text
    for name in SHARES:
        (folder / f"{name}.yaml").write_text(text.replace("name: sample", f"name: {name}").replace(
            "\ntrain:\n", f"\ntrain:\n  line: {LINE}\n"))
    (folder / "lines" / f"{LINE}.yaml").write_text(LINE_YAML)
    return folder


def _held_out(run: RunLayout, tokenizer: Path, texts: list[str]) -> None:
    """A few held-out documents in the run's holdout folder, as the pack tasks write them."""
    from tokenizers import Tokenizer

    from spark_jobs.steps import Packer
    from stoker.run.holdout import HoldoutPart

    tok = Tokenizer.from_file(str(tokenizer))
    part = HoldoutPart(packer=Packer(64, tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|pad|>")))
    for text in texts:
        part.add("held.jsonl", tok.encode(text, add_special_tokens=False).ids, text)
    part.write(run.holdout, 0, "uint16")


def _publish(kafka_config: dict, sample_corpus: dict) -> dict[str, RunLayout]:
    from stoker.config.corpus import TrainConfig
    from stoker_local.sample import texts

    docs = list(texts(sample_corpus["data"]))
    runs, at = {}, 0
    for name, rows in ROWS.items():
        run = RunLayout.of(name, DS)
        shutil.rmtree(run.run_dir, ignore_errors=True)
        publish_text_run(kafka_config, sample_corpus["tokenizer"], docs[at:at + 4 * rows], run.run_dir, ds=DS,
                         corpus=name, max_sequences=rows)
        write_plan(run.manifest, TrainConfig(line=LINE, world_size=1))
        _held_out(run, sample_corpus["tokenizer"], docs[at + 4 * rows:at + 4 * rows + 3])
        runs[name], at = run, at + 4 * rows + 3
    return runs


BAG = """
import json
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder="dags")
out = {"errors": bag.import_errors, "dags": {}}
for dag_id, dag in bag.dags.items():
    tt, cond = dag.timetable, getattr(dag.timetable, "asset_condition", None)
    out["dags"][dag_id] = {"tasks": [t.task_id for t in dag.topological_sort()], "timetable": type(tt).__name__,
                           "assets": sorted(a.name for a in cond.objects) if cond is not None else []}
print("BAG=" + json.dumps(out))
"""

LINE_TEST = """
import json
from datetime import datetime, timezone
import dags.line_dags as m
run = m.line_mixline.test(logical_date=datetime(2026, 12, 3, tzinfo=timezone.utc))
print("STATE=" + json.dumps(str(run.state)) + " RUN=" + json.dumps(run.run_id))
"""


def _python(code: str, env: dict, timeout: float) -> str:
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=timeout)
    return out.stdout + "\n" + out.stderr[-6000:]


def test_the_corpora_of_a_mixture_line_publish_and_the_lines_dag_is_scheduled_on_them(tmp_path):
    env = {**os.environ, "STOKER_CORPORA": str(_corpora(tmp_path))}
    out = _python(BAG, env, 300)
    bag = json.loads(next(ln for ln in out.splitlines() if ln.startswith("BAG="))[4:])
    assert bag["errors"] == {}, bag["errors"]
    for name in SHARES:  # the corpora publish; their nights train in the line's DAG
        assert bag["dags"][f"refresh_{name}"]["tasks"] == ["await_source", "publish.tokenize_publish",
                                                           "publish.await_published", "report"]
    line = bag["dags"][f"line_{LINE}"]
    assert line["tasks"] == ["plan", "training.train", "training.evaluate", "training.review", "report"]
    assert line["timetable"] == "PartitionedAssetTimetable"
    assert line["assets"] == sorted(f"stoker.{k}.sequences" for k in SHARES)


def test_a_mixture_line_trains_its_corpora_night_in_one_run(kafka_config, sample_corpus, airflow_db, tmp_path):
    from stoker.lines.mix_plan import read_plan

    env = {**os.environ, "STOKER_CORPORA": str(_corpora(tmp_path))}
    shutil.rmtree(LineLayout.of(LINE).folder, ignore_errors=True)
    runs = _publish(kafka_config, sample_corpus)
    out = _python(LINE_TEST, env, 900)
    assert 'STATE="success"' in out, out[-8000:]
    run_id = json.loads(out.split(" RUN=", 1)[1].splitlines()[0])

    line = LineLayout.of(LINE)
    plan = read_plan(line.mix_plan(DS))
    assert plan.night.rows == {"web": 60, "code": 30, "papers": 10} and not plan.missing
    assert json.loads(line.mix_claim(DS).read_text())["run_id"] == run_id
    shown = json.loads(subprocess.run([sys.executable, "-m", "stoker_local.cli", "runs", "show", f"web/{DS}", "--json"],
                                      capture_output=True, text=True, check=True, env=env).stdout)
    mixture = shown["training"]["mixture"]
    assert mixture["realised"]["rows"] == plan.night.rows
    for name, share in SHARES.items():  # every row is seq_len + 1 tokens: token shares are the row shares
        assert abs(mixture["realised"]["token_shares"][name] - share) < 0.005
    # scored on every corpus's held-out documents; the line's first night is promoted by the rule
    sets = shown["eval"]["sets"]
    assert {"night", "night:code", "night:papers"} <= set(sets)
    assert all(sets[k]["all"]["docs"] == 3 for k in ("night", "night:code", "night:papers"))
    assert shown["eval"]["decision"]["decision"] == "promoted"
    night = json.loads(line.night(DS, "web").record.read_text())
    topics = {k: json.loads(r.manifest.read_text())["topic"] for k, r in runs.items()}
    assert night["topic"] == topics["web"]  # the lead's; the line keeps every corpus's topic and rows too
    kept = night["mixture"]["components"]
    assert {k: (c["topic"], c["rows"]) for k, c in kept.items()} == {k: (topics[k], plan.night.rows[k]) for k in SHARES}
    card = line.night(DS, "web").card.read_text()
    assert "## Mixture nights" in card and all(f"| {DS} | {k} | `{topics[k]}` | {plan.night.rows[k]:,} |" in card
                                               for k in SHARES), card
    # the run's stage timings are the lead's, so the run page finds the DAG run
    timings = json.loads(runs["web"].timings.read_text())
    assert {"plan", "train", "evaluate", "report"} <= set(timings)
    assert all(row.get("run") == run_id for row in timings.values())
