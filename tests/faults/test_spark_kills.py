"""Hard faults on real processes (kill -9, not exceptions) while the Spark stage publishes, each checked
by Kafka's own console consumer (read_committed), an independent reader: every sequence of the manifest
exactly once, no key twice, every task's keys 0..n-1."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest
from fault_tools import assert_exactly_once, await_publishing, submit, write_corpus  # tests/faults/

from stoker.layout import RunLayout

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
        await_publishing(kafka_config, topic, proc)
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
    await_publishing(kafka_config, topic, proc)
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
