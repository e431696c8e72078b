"""Hard faults on real processes (kill -9, not exceptions) while the Spark stage publishes, each checked
by Kafka's own console consumer (read_committed), an independent reader: every sequence of the manifest
exactly once, no key twice, every task's keys 0..n-1."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from stoker.layout import RunLayout
from tests.support.fault_tools import assert_exactly_once, await_publishing, submit, write_corpus  # tests/faults/

pytestmark = pytest.mark.faults


@pytest.fixture()
def corpus(tmp_path, sample_corpus) -> Path:
    return write_corpus(tmp_path, sample_corpus, "faults")


def _is_daemon(p: psutil.Process) -> bool:
    """A live process of PySpark's worker daemon (the daemon forks one worker per running task)."""
    try:
        return p.status() != psutil.STATUS_ZOMBIE and "pyspark.daemon" in " ".join(p.cmdline())
    except psutil.Error:
        return False


def test_a_python_worker_killed_mid_transaction_is_retried_exactly_once(corpus, kafka_config, tmp_path):
    topic = "stoker.faults.20261201.a1"
    proc = submit(corpus, topic, tmp_path / "run", kafka_config)
    try:
        await_publishing(kafka_config, topic, proc, run_dir=tmp_path / "run")
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
    assert_exactly_once(kafka_config, tmp_path / "run")


def test_the_whole_job_killed_mid_publish_then_run_again_publishes_exactly_once(corpus, kafka_config, tmp_path):
    topic = "stoker.faults.20261201.a2"
    proc = submit(corpus, topic, tmp_path / "first", kafka_config)
    await_publishing(kafka_config, topic, proc, run_dir=tmp_path / "first")
    os.killpg(proc.pid, signal.SIGKILL)  # spark-submit, its JVM and every Python worker at once
    proc.wait(timeout=60)
    assert not RunLayout(tmp_path / "first").manifest.exists()
    # the rerun of the same topic (a re-run of the date) recreates it; the killed producers' transactions
    # are fenced by the new attempts' transactional ids
    again = submit(corpus, topic, tmp_path / "again", kafka_config, fresh=False)
    assert again.wait(timeout=600) == 0
    assert_exactly_once(kafka_config, tmp_path / "again")


def test_an_attempt_that_committed_but_never_reported_is_not_published_again(corpus, kafka_config, tmp_path):
    """The worker of task 1 is killed (SIGKILL) right after its commit: its result never reaches the
    driver, Spark runs the task again, and the retry must find the done record, not publish twice."""
    topic = "stoker.faults.20261201.a3"
    proc = submit(corpus, topic, tmp_path / "run", kafka_config, True, "--fail-first-attempt", "1:committed")
    assert proc.wait(timeout=600) == 0
    log = (tmp_path / "run.log").read_text(errors="replace")
    assert "Lost task 1.0" in log  # the first attempt died after its commit ...
    assert "task 1: an earlier attempt had committed; attempt 1 reused its done record" in log  # the retry
    assert_exactly_once(kafka_config, tmp_path / "run")


def _committed(kafka_config: dict, topic: str) -> list:
    from stoker.exceptions import StokerError
    from stoker.kafka import offsets as koffsets

    try:
        return koffsets.read_all(kafka_config, topic, timeout=10)
    except StokerError:  # not made yet: the job makes it before its pack pass
        return []


def _mid_task(committed: list) -> bool:
    """Some task has committed two transactions and not yet its last."""
    done = [json.loads(m.value()) for m in committed]
    tasks = {d["spark_partition"] for d in done}
    return any(sum(1 for d in done if d["spark_partition"] == t) >= 2
               and not any(d["final"] for d in done if d["spark_partition"] == t) for t in tasks)


@pytest.mark.parametrize("kill", [False, True])
def test_a_compressed_file_publishes_in_several_transactions_exactly_once(sample_corpus, kafka_config, tmp_path, kill):
    """A .jsonl.zst is read whole by one task, whose publish here takes far longer than the transaction
    timeout (2 s: a transaction is committed after 1 s). Its sequences go out in several transactions, each
    with a done record; a worker killed after some of them committed is retried, and the retry continues
    after what was committed."""
    from stoker.kafka import offsets as koffsets
    from stoker.layout import tasks_topic

    # 60,000 documents a file: about 11,000 sequences a task, some 6 s of packing on two cores (CI's
    # machine packed 30,000 in 3 s, two transactions only, and finished before the kill below)
    cfg = write_corpus(tmp_path, sample_corpus, "zst", compressed=True, docs_per_file=60_000,
                       publish={"transaction_timeout_ms": 2000})
    topic = f"stoker.zst.20261201.a{int(kill) + 1}"
    proc = submit(cfg, topic, tmp_path / "run", kafka_config)
    try:
        if kill:  # once some task committed two transactions and has more to go
            deadline = time.monotonic() + 300
            while not _mid_task(_committed(kafka_config, tasks_topic(topic))):
                assert proc.poll() is None and time.monotonic() < deadline, "no task two transactions in"
                time.sleep(0.2)
            workers = [p for p in psutil.Process(proc.pid).children(recursive=True)
                       if _is_daemon(p) and p.parent() is not None and _is_daemon(p.parent())]
            for w in workers:
                w.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=900) == 0, (tmp_path / "run.log").read_text(errors="replace")[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    keys = assert_exactly_once(kafka_config, tmp_path / "run")  # Kafka's own reader
    done = [json.loads(m.value()) for m in koffsets.read_all(kafka_config, tasks_topic(topic))]
    for task in {d["spark_partition"] for d in done}:
        mine = [d for d in done if d["spark_partition"] == task]
        assert len(mine) >= 3 and mine[-1]["final"] and not any(d["final"] for d in mine[:-1]), mine
    if kill:
        log = (tmp_path / "run.log").read_text(errors="replace")
        assert "Lost task" in log and "resumed after the" in log, log[-3000:]
    assert len(keys) > 0
