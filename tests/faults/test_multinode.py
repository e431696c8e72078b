"""Two training "nodes" on this machine, launched by the train operator in a real Airflow run: one
``torchrun`` per node joining a c10d rendezvous on 127.0.0.1. One node is then lost (SIGKILL to its
launcher and its rank): the task's supervisor stops the other node, the try fails, Airflow's retry
relaunches both from the last checkpoint, and every sequence is trained exactly once, counted against
Kafka's own ConsoleConsumer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from stoker.kafka import offsets as koffsets
from stoker.kafka import topics as ktopics
from stoker.kafka.lag import compute_lag
from stoker.layout import RunLayout, consumer_group
from stoker_local.sample import texts
from tests.support.trainer_tools import committed_keys
from training.metrics import read_log, trained_keys

pytestmark = pytest.mark.faults
REPO = Path(__file__).resolve().parents[2]
KILL_AT_STEP = 14  # past the checkpoint at step 10, before the end (~38 steps)

DAG = """
import json, os
from datetime import datetime, timedelta, timezone
from airflow.models import TaskInstance
from airflow.sdk import DAG
from airflow.utils.session import create_session
from stoker_airflow.operators.train import DeepSpeedTrainOperator

with DAG("stoker_two_nodes", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc)) as dag:
    DeepSpeedTrainOperator(task_id="train", manifest_path=os.environ["TWO_NODES_MANIFEST"], poll_interval=1,
                           extra_args=["--checkpoint-every", "10"], retries=1, retry_delay=timedelta(seconds=1))
if __name__ == "__main__":
    run = dag.test(logical_date=datetime(2026, 12, 8, tzinfo=timezone.utc))
    with create_session() as s:
        tis = s.query(TaskInstance).filter_by(dag_id=run.dag_id, run_id=run.run_id)
        print("TRIES=" + json.dumps({ti.task_id: ti.try_number for ti in tis}))
    print("STATE=" + json.dumps(str(run.state)))
"""


def _lose_a_node(files, killed: list[int]) -> None:
    """Once the trainer passed KILL_AT_STEP, SIGKILL the second node's torchrun and its rank."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        steps = [r["step"] for r in read_log(files.metrics)]
        pid = files.process.pid()
        if steps and max(steps) >= KILL_AT_STEP and pid:
            # an argument of the launcher (the heartbeat's subshell carries the script's text, not the argument)
            launchers = [p for p in psutil.Process(pid).children() if "torch.distributed.run" in p.cmdline()]
            if len(launchers) == 2:
                node = launchers[1]
                tree = [node, *node.children(recursive=True)]
                for p in tree:
                    p.kill()
                killed.extend(p.pid for p in tree)
                return
        time.sleep(0.2)


def test_two_nodes_train_every_sequence_once_and_survive_losing_one(kafka_config, sample_corpus, airflow_db,
                                                                    tmp_path):
    from stoker.config.corpus import TrainConfig
    from tests.support.trainer_tools import publish_text_run, write_plan

    run = RunLayout(tmp_path / "run")
    m = publish_text_run(kafka_config, sample_corpus["tokenizer"], list(texts(sample_corpus["data"]))[:150],
                         run.run_dir, ds="2026-12-08", corpus="twonodes")
    # the two nodes, the keys audit and the deadline are the corpus's train settings, in the run's plan
    write_plan(run.manifest, TrainConfig(world_size=2, nodes=["127.0.0.1", "localhost"], log_keys=True,
                                         timeout_s=900))
    files = run.trainer(m.topic)
    killed: list[int] = []
    killer = threading.Thread(target=_lose_a_node, args=(files, killed), daemon=True)
    killer.start()
    dags = tmp_path / "dags"  # dag.test() runs a DAG of the DAGs folder: this one's is its own
    dags.mkdir()
    (dags / "two_nodes.py").write_text(DAG)
    env = {**os.environ, "AIRFLOW__CORE__DAGS_FOLDER": str(dags), "TWO_NODES_MANIFEST": str(run.manifest)}
    out = subprocess.run([sys.executable, str(dags / "two_nodes.py")], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=1200)
    killer.join(timeout=60)
    logs = out.stdout[-5000:] + out.stderr[-5000:]
    assert killed, "no node was lost\n" + logs
    assert 'STATE="success"' in out.stdout, logs
    tries = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("TRIES="))[6:])
    assert tries["train"] == 2, tries
    assert "--nnodes 2" in out.stdout + out.stderr and "--rdzv-backend c10d" in out.stdout + out.stderr

    published = committed_keys(kafka_config["bootstrap.servers"], m.topic)  # Kafka's own reader
    trained = trained_keys(files)
    assert not [k for k, n in Counter(trained).items() if n > 1], "a sequence was trained twice"
    assert sorted(trained) == sorted(k.decode() for k in published) and len(published) == m.sequences
    ends = koffsets.committed_offsets(kafka_config, consumer_group(m.topic), m.topic, m.end_offsets())
    assert compute_lag(m.end_offsets(), ends).lag == 0
    summary = json.loads(files.summary.read_text())
    assert summary["world_size"] == 2 and sorted(r["rank"] for r in summary["ranks"]) == [0, 1]
    ktopics.delete_topics(kafka_config, [m.topic])
