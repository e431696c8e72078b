"""Hard faults on real processes (kill -9, not exceptions) while the Spark stage publishes, each checked
by Kafka's own console consumer (read_committed), an independent reader: every sequence of the manifest
exactly once, no key twice, every task's keys 0..n-1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from stoker import kafka as skafka
from stoker import paths, records
from stoker.layout import RunLayout
from stoker.local import broker
from stoker.manifest import read_manifest

pytestmark = pytest.mark.faults


@pytest.fixture()
def corpus(tmp_path, sample_corpus) -> Path:
    """About 24 MB of distinct documents, so the pack pass runs for several seconds on two cores."""
    from stoker.local import sample

    texts = list(sample.texts(sample_corpus["data"]))
    folder = tmp_path / "night"
    folder.mkdir()
    for f in range(2):
        with open(folder / f"part-{f}.jsonl", "w") as out:
            for n in range(f * 30_000, (f + 1) * 30_000):
                out.write(json.dumps({"text": f"{texts[n % len(texts)]} [{n}]"}) + "\n")
    (folder / "_SUCCESS").write_text("")
    cfg = tmp_path / "faults.yaml"
    cfg.write_text(json.dumps({"name": "faults", "source": {"uri": str(folder)},
                               "tokenizer": {"path": str(sample_corpus["tokenizer"])},
                               "pack": {"seq_len": 512}, "topic": {"partitions": 4},
                               "publish": {"spark_partitions": 4}}))
    return cfg


def _submit(cfg: Path, topic: str, run_dir: Path, kafka_config: dict, fresh: bool = True) -> subprocess.Popen:
    from stoker.layout import tasks_topic
    from stoker_airflow.operators import default_spark_conf

    if fresh:  # no topic of an earlier test run: publishing is seen when this job's records arrive
        skafka.delete_topics(kafka_config, [topic, tasks_topic(topic)])

    cmd = [str(paths.venv_bin("spark-submit")), "--master", "local[2,4]",
           *[a for k, v in default_spark_conf().items() for a in ("--conf", f"{k}={v}")],
           str(paths.project_root() / "spark_jobs" / "tokenize_publish.py"), "--corpus", str(cfg),
           "--ds", "2026-12-01", "--topic", topic, "--run-dir", str(run_dir)]
    env = {**os.environ, "STOKER_KAFKA_CONFIG": json.dumps(kafka_config), "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    log = open(run_dir.parent / f"{run_dir.name}.log", "wb")  # noqa: SIM115 - the child writes it
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _await_publishing(kafka_config: dict, topic: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    """Until records of open transactions reach the topic (the pack pass is publishing)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if sum(skafka.end_offsets(kafka_config, topic, committed_only=False).values()) > 0:
                return
        except Exception:  # noqa: BLE001 - the topic is made by the job
            pass
        time.sleep(0.2)
    raise AssertionError(f"{topic}: no record published within {timeout}s (job exit code {proc.poll()})")


def _console_consumer(bootstrap: str, topic: str) -> list[bytes]:
    """Every committed key of ``topic``, read by Kafka's own ConsoleConsumer."""
    cmd = broker.tool_command("org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", bootstrap,
                              "--topic", topic, "--from-beginning", "--timeout-ms", "15000",
                              "--isolation-level", "read_committed", "--property", "print.key=true",
                              "--property", "print.value=false", "--property", "key.separator=|")
    res = subprocess.run(cmd, capture_output=True, timeout=300)
    keys = [line.strip() for line in res.stdout.splitlines() if line.strip()]
    assert keys or res.returncode == 0, res.stderr.decode()[-2000:]
    return keys


def _assert_exactly_once(kafka_config: dict, run_dir: Path) -> None:
    m = read_manifest(run_dir)
    keys = _console_consumer(kafka_config["bootstrap.servers"], m.topic)
    assert len(keys) == m.sequences, f"the independent reader saw {len(keys)} sequences, the manifest {m.sequences}"
    assert not [k for k, n in Counter(keys).items() if n > 1], "a sequence is committed twice"
    by_task: dict[int, list[int]] = {}
    for k in keys:
        task, idx = records.parse_key(k)
        by_task.setdefault(task, []).append(idx)
    assert all(sorted(ix) == list(range(len(ix))) for ix in by_task.values()), "a task's keys have a gap"


def _is_daemon(p: psutil.Process) -> bool:
    """A live process of PySpark's worker daemon (the daemon forks one worker per running task)."""
    try:
        return p.status() != psutil.STATUS_ZOMBIE and "pyspark.daemon" in " ".join(p.cmdline())
    except psutil.Error:
        return False


def test_a_python_worker_killed_mid_transaction_is_retried_exactly_once(corpus, kafka_config, tmp_path):
    topic = "stoker.faults.20261201.a1"
    proc = _submit(corpus, topic, tmp_path / "run", kafka_config)
    try:
        _await_publishing(kafka_config, topic, proc)
        workers = [p for p in psutil.Process(proc.pid).children(recursive=True)
                   if _is_daemon(p) and p.parent() is not None and _is_daemon(p.parent())]
        assert workers, "no forked pyspark worker to kill"
        workers[0].send_signal(signal.SIGKILL)  # a task's worker, mid-transaction
        assert proc.wait(timeout=600) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    log = (tmp_path / "run.log").read_text(errors="replace")
    assert "Lost task" in log  # the kill landed: Spark retried the task, the retry fenced the killed attempt
    _assert_exactly_once(kafka_config, tmp_path / "run")


def test_the_whole_job_killed_mid_publish_then_run_again_publishes_exactly_once(corpus, kafka_config, tmp_path):
    topic = "stoker.faults.20261201.a2"
    proc = _submit(corpus, topic, tmp_path / "first", kafka_config)
    _await_publishing(kafka_config, topic, proc)
    os.killpg(proc.pid, signal.SIGKILL)  # spark-submit, its JVM and every Python worker at once
    proc.wait(timeout=60)
    assert not RunLayout(tmp_path / "first").manifest.exists()
    # the rerun of the same topic (a re-run of the date) recreates it; the killed producers' transactions
    # are fenced by the new attempts' transactional ids
    again = _submit(corpus, topic, tmp_path / "again", kafka_config, fresh=False)
    assert again.wait(timeout=600) == 0
    _assert_exactly_once(kafka_config, tmp_path / "again")
