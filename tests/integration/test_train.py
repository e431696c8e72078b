"""The DeepSpeed trainer on CPU against the real broker: 2 ranks consume every sequence exactly
once, a kill -9 resumes exactly from the checkpoint, and a 2-rank checkpoint resumes on 1 rank."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from stoker import kafka as skafka
from stoker import records
from stoker.manifest import Manifest, PartitionRange, write_manifest
from training.metrics import read_metrics

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
SEQ_LEN = 32
PARTITIONS = 4


@pytest.fixture()
def run(kafka_config, sample_corpus, tmp_path):
    """A published run: 4 partitions, 41 sequences each (odd, so batches end unevenly), its manifest."""
    from confluent_kafka import Producer

    topic = f"stoker.train.{time.time_ns()}.a1"
    skafka.create_topic(kafka_config, topic, PARTITIONS)
    producer = Producer({**kafka_config, "transactional.id": topic, "acks": "all"})
    producer.init_transactions(30)
    producer.begin_transaction()
    rng = np.random.default_rng(0)
    counts = Counter()
    for i in range(PARTITIONS * 41):
        p = i % PARTITIONS
        tokens = rng.integers(2, 8192, SEQ_LEN + 1)
        producer.produce(topic, key=records.make_key(0, i), partition=p, value=records.encode_value(tokens, "uint16"),
                         headers=records.encode_headers("t/2026-12-01", "uint16", doc_starts=[0, 11]))
        counts[p] += 1
    producer.commit_transaction(30)
    ends = skafka.stable_end_offsets(kafka_config, topic)
    m = Manifest(run_id="t/2026-12-01", corpus="t", ds="2026-12-01", topic=topic,
                 partitions=[PartitionRange(partition=p, start_offset=0, end_offset=ends[p], sequences=counts[p])
                             for p in range(PARTITIONS)],
                 seq_len=SEQ_LEN, dtype="uint16", tokenizer_path=str(sample_corpus["tokenizer"]),
                 tokenizer_sha256="0" * 64, vocab_size=8192, docs_in=1, docs_kept=1, docs_dropped={},
                 tokens=sum(counts.values()) * (SEQ_LEN + 1), padding_tokens=0, sequences=sum(counts.values()),
                 source_uri="/synthetic")
    write_manifest(tmp_path / "run", m)
    yield m, tmp_path / "run" / "manifest.json", kafka_config
    skafka.delete_topics(kafka_config, [topic])


def _launch(manifest_path: Path, out: Path, kafka_config: dict, nproc: int, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "STOKER_KAFKA_CONFIG": json.dumps(kafka_config),
           "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR",
                                                  str(Path.home() / ".cache" / "stoker" / "torch-extensions"))}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
           str(29600 + os.getpid() % 300), str(REPO / "training" / "train.py"), "--manifest", str(manifest_path),
           "--out", str(out), "--micro-batch-size", "2", "--log-keys", str(out / "keys.{rank}.jsonl"), *extra]
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / f"launch-{time.time_ns()}.log", "w")  # noqa: SIM115 - the child owns it
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)


def _wait(proc: subprocess.Popen, out: Path, timeout: float = 600) -> None:
    rc = proc.wait(timeout=timeout)
    logs = "".join(p.read_text()[-3000:] for p in sorted(out.glob("launch-*.log")))
    assert rc == 0, logs


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher and every process under it (torchrun starts its ranks in sessions of their own)."""
    import psutil

    tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    for p in tree:
        p.send_signal(signal.SIGKILL)
    psutil.wait_procs(tree, timeout=30)
    proc.wait()


def _keys_by_step(out: Path) -> dict[int, list[str]]:
    """step → keys trained in that step (all ranks); a torn last line of a killed rank is skipped."""
    steps: dict[int, list[str]] = {}
    for f in out.glob("keys.*.jsonl"):
        for line in f.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            steps.setdefault(row["step"], []).extend(row["keys"])
    return steps


def _all_keys(m: Manifest) -> list[str]:
    return sorted(records.make_key(0, i).decode() for i in range(m.sequences))


def test_two_ranks_consume_every_sequence_exactly_once(run, tmp_path):
    m, path, kafka_config = run
    out = tmp_path / "train"
    _wait(_launch(path, out, kafka_config, 2, "--checkpoint-every", "4"), out)
    keys = [k for ks in _keys_by_step(out).values() for k in ks]
    assert sorted(keys) == _all_keys(m)  # the union is the manifest, no key twice
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["sequences_this_session"] == m.sequences
    # the consumer group ends at the manifest's end offsets: the lag sensor sees 0
    committed = skafka.committed_offsets(kafka_config, summary["group_id"], m.topic, range(PARTITIONS))
    assert skafka.compute_lag(m.end_offsets(), committed).lag == 0
    rows = read_metrics(out / "metrics.jsonl")
    assert {"loss", "lr", "tokens_per_s", "data_wait_fraction", "expert_load_max_over_mean"} <= set(rows[0])
    assert (out / "loss.png").stat().st_size > 0 and list((out / "tensorboard").iterdir())

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(summary["export"], local_files_only=True)
    assert model.config.model_type == "deepseek_v3"


def test_kill_9_then_resume_consumes_exactly_the_manifest(run, tmp_path):
    m, path, kafka_config = run
    out = tmp_path / "train"
    proc = _launch(path, out, kafka_config, 2, "--checkpoint-every", "3")
    deadline = time.monotonic() + 600
    while max(_keys_by_step(out), default=0) < 8:  # past the checkpoint at step 6, long before the end (41)
        assert proc.poll() is None, "the trainer ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.1)
    _kill_tree(proc)  # the launcher and both ranks, no chance to clean up
    first = _keys_by_step(out)
    ckpt_step = int((out / "checkpoints" / "latest").read_text().strip().removeprefix("step"))
    assert 6 <= ckpt_step < max(first)
    losses_1 = {r["step"]: r["loss"] for r in read_metrics(out / "metrics.jsonl")}
    for f in out.glob("keys.*.jsonl"):
        f.rename(f.with_suffix(".first"))

    _wait(_launch(path, out, kafka_config, 2, "--checkpoint-every", "3"), out)
    second = _keys_by_step(out)
    assert min(second) == ckpt_step + 1  # the resumed run continues from the checkpoint's step
    kept = [k for s, ks in first.items() if s <= ckpt_step for k in ks]
    assert sorted(kept + [k for ks in second.values() for k in ks]) == _all_keys(m)
    # same weights, optimizer and data after the checkpoint: the resumed loss continues the curve
    losses_2 = {r["step"]: r["loss"] for r in read_metrics(out / "metrics.jsonl") if r["step"] > ckpt_step}
    assert losses_2[ckpt_step + 1] == pytest.approx(losses_1[ckpt_step + 1], rel=1e-3)


def test_resume_two_ranks_on_one_rank(run, tmp_path):
    m, path, kafka_config = run
    out = tmp_path / "train"
    _wait(_launch(path, out, kafka_config, 2, "--max-steps", "4", "--checkpoint-every", "2"), out)
    first = [k for ks in _keys_by_step(out).values() for k in ks]
    for f in out.glob("keys.*.jsonl"):
        f.rename(f.with_suffix(".first"))
    _wait(_launch(path, out, kafka_config, 1), out)
    second = [k for ks in _keys_by_step(out).values() for k in ks]
    assert len(first) == 16
    assert sorted(first + second) == _all_keys(m)

    # the topic is re-published under the same name (a second DAG run of the date): the old
    # checkpoint's offsets must not be applied to the new data
    write_manifest(path.parent, dataclasses.replace(m, created_at="2026-12-02T00:00:00+00:00"))
    proc = _launch(path, out, kafka_config, 1)
    assert proc.wait(timeout=600) != 0
    log = max(out.glob("launch-*.log"), key=lambda p: p.stat().st_mtime_ns).read_text()
    assert "re-published" in log and str(out / "checkpoints") in log
