"""The fault suite's tools: a corpus and a spark-submit of the Spark stage to hurt, and an independent
reader, Kafka's own ConsoleConsumer (read_committed), never Stoker's code, to count what a run committed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from stoker import paths
from stoker.kafka import offsets as koffsets
from stoker.kafka import topics as ktopics
from stoker.run import records
from stoker.run.manifest import read_manifest
from tests.support.trainer_tools import committed_keys


def write_corpus(tmp_path: Path, sample_corpus: dict[str, Path], name: str, *, compressed: bool = False,
                 publish: dict[str, Any] | None = None, docs_per_file: int = 30_000,
                 tokenizer_backend: str = "tokenizers", **topic: Any) -> Path:
    """Two files of distinct documents (about 12 MB each at 30,000), so the pack pass runs for several
    seconds on two cores; the corpus config ``name`` reads them (``topic`` adds topic settings, ``publish``
    publish settings). ``compressed``: as ``.jsonl.zst`` files, each read whole by one task.

    The faults these tests inject land inside the pack pass (kills between transactions, a publish longer than
    the transaction timeout), so they need a pass of several seconds: they encode with the reference backend by
    default, ~6 s a task here. The fast one packs the same night in well under a second
    (spark_jobs/tokenizer_backends.py), too short to kill in the middle of."""
    from stoker_local import sample

    texts = list(sample.texts(sample_corpus["data"]))
    folder = tmp_path / "night"
    folder.mkdir()
    for f in range(2):
        lines = "".join(json.dumps({"text": f"{texts[n % len(texts)]} [{n}]"}) + "\n"
                        for n in range(f * docs_per_file, (f + 1) * docs_per_file))
        if compressed:
            import zstandard

            (folder / f"part-{f}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines.encode()))
        else:
            (folder / f"part-{f}.jsonl").write_text(lines)
    (folder / "_SUCCESS").write_text("")
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(json.dumps({"name": name, "source": {"uri": str(folder)},
                               "tokenizer": {"path": str(sample_corpus["tokenizer"]), "backend": tokenizer_backend},
                               "pack": {"seq_len": 512}, "topic": {"partitions": 4, **topic},
                               "publish": {"spark_partitions": 4, **(publish or {})}}))
    return cfg


def soak_workspace(name: str) -> tuple[Path, Path, dict[str, Path]]:
    """A soak's folders, emptied (``.stoker/<name>/`` and its ``work/``), and the sample corpus's data and
    tokenizer as ``make setup`` made them (the soaks run outside pytest, without its fixtures)."""
    import shutil

    home = paths.state_dir() / name
    shutil.rmtree(home, ignore_errors=True)
    (home / "work").mkdir(parents=True)
    sample = {"data": paths.state_dir() / "data" / "sample",
              "tokenizer": paths.state_dir() / "tokenizers" / "sample-bpe-8192" / "tokenizer.json"}
    return home, home / "work", sample


def submit(cfg: Path, topic: str, run_dir: Path, kafka_config: dict, fresh: bool = True,
            *extra: str) -> subprocess.Popen:
    from stoker.layout import tasks_topic
    from stoker.run.plan import plan_run
    from stoker_airflow.operators.publish import default_spark_conf

    plan = plan_run(cfg, "2026-12-01", attempt=int(topic.rsplit(".a", 1)[1]))  # as the publish task does
    assert plan.topic == topic, (plan.topic, topic)
    run_dir.mkdir(parents=True, exist_ok=True)
    plan.write(run_dir / "plan.json")
    if fresh:  # no topic of an earlier test run: publishing is seen when this job's records arrive
        ktopics.delete_topics(kafka_config, [topic, tasks_topic(topic)])

    cmd = [str(paths.venv_bin("spark-submit")), "--master", "local[2,4]",
           *[a for k, v in default_spark_conf().items() for a in ("--conf", f"{k}={v}")],
           str(paths.project_root() / "spark_jobs" / "tokenize_publish.py"), "--plan",
           str(run_dir / "plan.json"), *extra]
    env = {**os.environ, "STOKER_KAFKA_CONFIG": json.dumps(kafka_config), "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    log = open(job_log(run_dir), "wb")  # noqa: SIM115 - the child writes it
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def job_log(run_dir: Path) -> Path:
    """Where :func:`submit` sends the job's output."""
    return run_dir.parent / f"{run_dir.name}.log"


def await_publishing(kafka_config: dict, topic: str, proc: subprocess.Popen, timeout: float = 300,
                     run_dir: Path | None = None) -> None:
    """Until records of open transactions reach the topic (the pack pass is publishing); a job that
    ends first fails the test with its log's tail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if sum(koffsets.end_offsets(kafka_config, topic, committed_only=False).values()) > 0:
                return
        except Exception:  # noqa: BLE001 - the topic is made by the job
            pass
        time.sleep(0.2)
    tail = ""
    if run_dir is not None and job_log(run_dir).exists():
        lines = job_log(run_dir).read_text(errors="replace").splitlines()
        tail = "\n".join(ln for ln in lines if not ln.startswith("%"))[-4000:]  # librdkafka's lines aside
    raise AssertionError(f"{topic}: no record published within {timeout}s (job exit code {proc.poll()})\n{tail}")


def assert_exactly_once(kafka_config: dict, run_dir: Path) -> list[bytes]:
    m = read_manifest(run_dir)
    keys = committed_keys(kafka_config["bootstrap.servers"], m.topic)
    assert len(keys) == m.sequences, f"the independent reader saw {len(keys)} sequences, the manifest {m.sequences}"
    assert not [k for k, n in Counter(keys).items() if n > 1], "a sequence is committed twice"
    by_task: dict[int, list[int]] = {}
    for k in keys:
        task, idx = records.parse_key(k)
        by_task.setdefault(task, []).append(idx)
    assert all(sorted(ix) == list(range(len(ix))) for ix in by_task.values()), "a task's keys have a gap"
    return keys
