"""A whole trainer killed mid-run (SIGKILL to its launcher and every rank at once, as a lost or
preempted node): the train task notices within one poll, Airflow's retry relaunches it from its
last checkpoint, and the night still ends with every sequence of the manifest trained exactly once.
Counted by Kafka's own ConsoleConsumer (read_committed) against the trainer's keys audit log."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from stoker.kafka import offsets as koffsets
from stoker.kafka.lag import compute_lag
from stoker.layout import LineLayout, RunLayout, TrainerFiles, consumer_group
from stoker.run.manifest import read_manifest
from tests.support.fault_tools import assert_exactly_once
from tests.support.trainer_tools import first_night
from training.metrics import read_log, trained_keys

pytestmark = pytest.mark.faults
REPO = Path(__file__).resolve().parents[2]
DS = "2026-12-07"
NIGHT_ONE = "2026-12-06"
KILL_AT_STEP = 14  # past the checkpoint at step 10 (the recipe below), long before the end (about 33 steps)
RECIPE = "base: debug_cpu\ncheckpoint_every: 10\n"

DAG_TEST = """
import json
from datetime import datetime, timezone
from airflow.models import TaskInstance
from airflow.utils.session import create_session
import dags.refresh_dags as m
run = m.refresh_trainkill.test(logical_date=datetime(2026, 12, 7, tzinfo=timezone.utc), run_conf={"review": "hold"})
with create_session() as s:
    tis = s.query(TaskInstance).filter_by(dag_id=run.dag_id, run_id=run.run_id)
    print("TRIES=" + json.dumps({ti.task_id: ti.try_number for ti in tis}))
print("STATE=" + json.dumps(str(run.state)))
"""


class _Killer:
    """Waits for the run's trainer to pass ``KILL_AT_STEP``, then kills it as a whole."""

    def __init__(self, run: RunLayout) -> None:
        self.run = run
        self.killed: list[int] = []
        self.error = ""
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _trainer(self) -> TrainerFiles | None:
        folders = list((self.run.run_dir / "train").glob("*/trainer.pid"))
        return TrainerFiles(folders[0].parent) if folders else None

    def _watch(self, timeout: float = 900) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            files = self._trainer()
            steps = [r["step"] for r in read_log(files.metrics)] if files else []
            pid = files.process.pid() if files else None
            if steps and max(steps) >= KILL_AT_STEP and pid:
                tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
                for p in tree:  # the shell, the launcher and every rank: nobody writes an exit code
                    with contextlib.suppress(psutil.NoSuchProcess):  # the heartbeat's short-lived sleep/date
                        p.kill()
                psutil.wait_procs(tree, timeout=30)
                self.killed = [p.pid for p in tree]
                return
            time.sleep(0.2)
        self.error = f"the trainer never reached step {KILL_AT_STEP}"

    def join(self) -> None:
        self._thread.join(timeout=60)


@pytest.fixture()
def corpora(tmp_path, sample_corpus) -> Path:
    """The sample corpus as `trainkill` (one of its shards: a short night), with the keys audit log on, a
    checkpoint every 10 steps and a quick relaunch."""
    folder = tmp_path / "corpora"
    (folder / "recipes").mkdir(parents=True)
    (folder / "recipes" / "trainkill.yaml").write_text(RECIPE)
    drop = tmp_path / "drop"
    drop.mkdir()
    shutil.copy(sample_corpus["data"] / "part-00002.jsonl", drop)  # bad records and duplicates included
    (drop / "_SUCCESS").write_text("")
    text = (REPO / "corpora" / "sample.yaml").read_text().replace("name: sample", "name: trainkill")
    for old, new in (('uri: "{state}/data/sample"', f'uri: "{drop}"'), ("recipe: debug_cpu", "recipe: trainkill"),
                     ("  timeout_s: 3600\n", "  timeout_s: 1200\n  log_keys: true\n  restart_delay_s: 1\n"
                                             "  max_restarts: 2\n")):
        assert old in text, old
        text = text.replace(old, new)
    (folder / "trainkill.yaml").write_text(text.replace("holdout_per_mille: 5", "holdout_per_mille: 20"))
    return folder


def m_world(files: TrainerFiles) -> int:
    return int(json.loads(files.summary.read_text())["world_size"])


def test_a_trainer_killed_as_a_whole_is_relaunched_and_trains_every_sequence_once(
        corpora, kafka_config, sample_corpus, airflow_db, tmp_path):
    run = RunLayout.of("trainkill", DS)
    shutil.rmtree(run.run_dir, ignore_errors=True)  # an earlier test run's trainer is not this one's
    night_one = first_night(kafka_config, sample_corpus, tmp_path, "trainkill", NIGHT_ONE)
    killer = _Killer(run)
    env = {**os.environ, "STOKER_CORPORA": str(corpora)}
    out = subprocess.run([sys.executable, "-c", DAG_TEST], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=1500)
    killer.join()
    logs = out.stdout[-6000:] + out.stderr[-6000:]
    assert killer.killed, (killer.error or "the killer did not run") + "\n" + logs
    assert 'STATE="success"' in out.stdout, logs
    tries = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("TRIES="))[6:])
    assert tries["training.train"] == 2 and tries["training.evaluate"] == 1, tries  # one death, one relaunch
    assert "was killed as a whole" in out.stdout + out.stderr  # told apart from a clean exit

    m = read_manifest(run.run_dir)
    committed = assert_exactly_once(kafka_config, run.run_dir)  # Kafka's own reader: what was published
    files = run.trainer(m.topic)
    trained = trained_keys(files)
    assert not [k for k, n in Counter(trained).items() if n > 1], "a sequence was trained twice"
    assert sorted(trained) == sorted(k.decode() for k in committed), "trained keys != the published sequences"
    # the second life resumed from the checkpoint at step 10, not from the start
    rows = read_log(Path(str(files.keys_log).replace("{rank}", "0")))
    restarts = [b["step"] for a, b in zip(rows, rows[1:], strict=False) if b["step"] <= a["step"]]
    assert restarts == [11], restarts
    ends = koffsets.committed_offsets(kafka_config, consumer_group(m.topic), m.topic, m.end_offsets())
    assert compute_lag(m.end_offsets(), ends).lag == 0
    # night 2 of the line, both lives: started from night 1's model, and joined the line only once done
    assert json.loads(files.parent.read_text())["path"] == night_one
    # every rank, twice: night 1's trunk (wsd, the default schedule: the state before its cooldown)
    assert files.log.read_text().count(f"weights from {night_one}/trunk") == 2 * m_world(files)
    night = LineLayout.of("trainkill").night(DS, "trainkill")
    lineage = json.loads(night.record.read_text())["lineage"]
    assert [e.get("ds") for e in lineage] == [None, NIGHT_ONE, DS] and lineage[-1]["topic"] == m.topic
    # evaluated on its held-out documents against night 1's model, which it continued
    figures = json.loads(run.evaluation.read_text())
    assert figures["baseline"] == f"{night_one}/hf" and list(figures["sets"]) == ["night"]
    night_set = figures["sets"]["night"]["all"]
    assert night_set["docs"] == m.holdout["docs"] > 0 and night_set["bytes"] == m.holdout["bytes"]
    assert night_set["bpb"] > 0 and night_set["baseline_bpb"] > 0 and "delta_stderr" in night_set
    assert sorted(p.name for p in night.holdout.iterdir()) == sorted(p.name for p in run.holdout.iterdir())
    summary = json.loads(run.summary.read_text())
    assert summary["eval"]["sets"]["night"]["all"] == night_set and summary["holdout"]["docs"] == m.holdout["docs"]
    # better than night 1 on its own held-out text: the gate makes it the line's head, and its card says so
    assert night_set["delta"] < 0 and summary["eval"]["decision"]["decision"] == "promoted"
    assert json.loads(night.record.read_text())["decision"]["decision"] == "promoted"
    assert "Decision: **promoted** by gate" in night.card.read_text() == files.export.joinpath("README.md").read_text()
