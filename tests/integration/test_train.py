"""The DeepSpeed trainer on CPU against the real broker: 2 ranks consume every sequence exactly
once, a kill -9 resumes with the uninterrupted run's batches, and a 2-rank checkpoint resumes on 1 rank
(kills inside accumulation windows, under ZeRO, are in test_train_shapes.py)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from stoker.kafka import offsets as koffsets
from stoker.kafka import topics as ktopics
from stoker.kafka.lag import compute_lag
from stoker.run.manifest import write_manifest
from tests.support.trainer_tools import all_keys, keys_by_step, kill_tree, launch_trainer, publish_run, wait_trainer
from training.metrics import read_metrics

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
SEQ_LEN = 32
PARTITIONS = 4


@pytest.fixture()
def run(kafka_config, sample_corpus, tmp_path):
    """A published run: 4 partitions, 41 sequences each (odd, so batches end unevenly), its manifest."""
    m = publish_run(kafka_config, sample_corpus["tokenizer"], tmp_path / "run", partitions=PARTITIONS,
                    per_partition=41, seq_len=SEQ_LEN)
    yield m, tmp_path / "run" / "manifest.json", kafka_config
    ktopics.delete_topics(kafka_config, [m.topic])


def test_two_ranks_consume_every_sequence_exactly_once(run, tmp_path):
    m, path, kafka_config = run
    out = tmp_path / "train"
    # 41 steps (2 ranks x 2 sequences): the last step is a checkpoint step, and reaching the end still
    # moves the offsets past the final transaction markers, which must reach the group too
    wait_trainer(launch_trainer(path, out, kafka_config, 2, "--checkpoint-every", "41"), out)
    keys = [k for ks in keys_by_step(out).values() for k in ks]
    assert sorted(keys) == all_keys(m)  # the union is the manifest, no key twice
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["sequences_this_session"] == m.sequences
    # the consumer group ends at the manifest's end offsets: the lag sensor sees 0
    committed = koffsets.committed_offsets(kafka_config, summary["group_id"], m.topic, range(PARTITIONS))
    assert compute_lag(m.end_offsets(), committed).lag == 0
    rows = read_metrics(out / "metrics.jsonl")
    assert {"loss", "lr", "tokens_per_s", "data_wait_fraction", "expert_load_max_over_mean"} <= set(rows[0])
    assert (out / "loss.png").stat().st_size > 0 and list((out / "tensorboard").iterdir())

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(summary["export"], local_files_only=True)
    assert model.config.model_type == "deepseek_v3"


def test_resume_two_ranks_on_one_rank(run, tmp_path):
    m, path, kafka_config = run
    out = tmp_path / "train"
    wait_trainer(launch_trainer(path, out, kafka_config, 2, "--max-steps", "4", "--checkpoint-every", "2"), out)
    first = [k for ks in keys_by_step(out).values() for k in ks]
    for f in out.glob("keys.*.jsonl"):
        f.rename(f.with_suffix(".first"))
    wait_trainer(launch_trainer(path, out, kafka_config, 1), out)
    second = [k for ks in keys_by_step(out).values() for k in ks]
    assert len(first) == 16
    assert sorted(first + second) == all_keys(m)

    # the topic is re-published under the same name (a second DAG run of the date): the old
    # checkpoint's offsets must not be applied to the new data
    write_manifest(path.parent, dataclasses.replace(m, created_at="2026-12-02T00:00:00+00:00"))
    proc = launch_trainer(path, out, kafka_config, 1)
    assert proc.wait(timeout=600) != 0
    log = max(out.glob("launch-*.log"), key=lambda p: p.stat().st_mtime_ns).read_text()
    assert "re-published" in log and str(out / "checkpoints") in log


def _keys_by_rank_step(out: Path, suffix: str = ".jsonl") -> dict[tuple[int, int], list[str]]:
    """(rank, step) → the keys that rank trained in that step."""
    found: dict[tuple[int, int], list[str]] = {}
    for f in out.glob(f"keys.*{suffix}"):
        rank = int(f.name.split(".")[1])
        for line in f.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # the torn last line of a killed rank
                continue
            found[(rank, row["step"])] = row["keys"]
    return found


def test_batches_depend_on_the_manifest_and_world_size_only_also_across_a_resume(run, tmp_path):
    """Two runs of one manifest at one world size train the same keys in the same batches on the same
    ranks, whatever the fetch timing; a run killed and resumed from its checkpoint continues with the
    batches the uninterrupted run trained."""
    m, path, kafka_config = run
    ref = tmp_path / "reference"
    wait_trainer(launch_trainer(path, ref, kafka_config, 2, "--group-id", "ref"), ref)
    expected = _keys_by_rank_step(ref)
    assert len(expected) == 2 * 41 and sorted(k for ks in expected.values() for k in ks) == all_keys(m)
    # predicted from the manifest alone: rank r reads partitions r and r+2, and each row comes from the one
    # that advanced least (sequence i is in partition i % 4, in order), so batch s pairs the s-th of each
    from stoker.run.records import make_key

    assert expected == {(r, s): [make_key(0, 4 * (s - 1) + p).decode() for p in (r, r + 2)]
                        for r in (0, 1) for s in range(1, 42)}

    out = tmp_path / "killed"
    proc = launch_trainer(path, out, kafka_config, 2, "--checkpoint-every", "4", "--group-id", "killed")
    deadline = time.monotonic() + 600
    while max(keys_by_step(out), default=0) < 10:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    kill_tree(proc)
    for f in out.glob("keys.*.jsonl"):
        f.rename(f.with_suffix(".first"))
    first = _keys_by_rank_step(out, ".first")
    assert first == {k: expected[k] for k in first}  # the same batches, up to the kill
    wait_trainer(launch_trainer(path, out, kafka_config, 2, "--checkpoint-every", "4", "--group-id", "killed"), out)
    second = _keys_by_rank_step(out)
    ckpt = min(step for _, step in second) - 1
    assert ckpt % 4 == 0 and ckpt >= 8
    assert second == {k: v for k, v in expected.items() if k[1] > ckpt}  # and the same after the resume


def test_the_source_reads_the_manifest_range_only_whatever_follows_it(run):
    """Records published after the manifest's end (a later transaction, an aborted one) are not this
    run's: each rank reads exactly its partitions' manifest ranges, in the order rule's batches, and
    ends with every offset at the manifest's end."""
    from confluent_kafka import Producer

    from stoker.run import records
    from stoker.run.records import make_key
    from training.data.kafka_source import KafkaTokenSource

    m, _, kafka_config = run
    producer = Producer({**kafka_config, "transactional.id": m.topic + ".more", "acks": "all"})
    producer.init_transactions(30)
    for commit in (False, True):
        producer.begin_transaction()
        for p in range(PARTITIONS):
            producer.produce(m.topic, key=b"after-the-end", partition=p, value=records.encode_value(
                [1] * (SEQ_LEN + 1), "uint16"), headers=records.encode_headers("t/2026-12-01", "uint16"))
        producer.commit_transaction(30) if commit else producer.abort_transaction(30)
    for rank in (0, 1):
        src = KafkaTokenSource(kafka_config=kafka_config, manifest=m, rank=rank, world=2, batch_size=3,
                               group_id=f"range-{rank}")
        batches = []
        while (pending := src.next_batch()) is not None:
            src.mark_trained(pending)
            batches.append([k.decode() for k in pending.batch.keys])
        src.close()
        rows = [make_key(0, 4 * i + p).decode() for i in range(41) for p in (rank, rank + 2)]
        assert batches == [rows[i:i + 3] for i in range(0, len(rows), 3)]
        assert {p: src.offsets[p] for p in (rank, rank + 2)} == {p.partition: p.end_offset for p in m.partitions
                                                               if p.partition in (rank, rank + 2)}


def test_take_and_rewind_read_a_partition_again_also_when_a_resume_finds_it_at_its_end(run):
    """A mixture night that repeats a short corpus reads its partitions a second time (``rewind``): from a
    partition the session is reading (a seek), and from one that was at its end when the session opened (a
    resume right after a pass: it was never assigned). Each pass is the partition's committed records in
    offset order, and reading past the last is DataLost, never a silent wrap."""
    from stoker.run.records import make_key
    from training.data.kafka_source import DataLost, KafkaTokenSource

    m, _, kafka_config = run
    first = [make_key(0, 4 * i).decode() for i in range(41)]  # partition 0's keys, in offset order

    def source() -> KafkaTokenSource:
        return KafkaTokenSource(kafka_config=kafka_config, manifest=m, rank=0, world=1, batch_size=1,
                                group_id="rewind")

    def read(src: KafkaTokenSource, n: int) -> list[str]:
        return [src.take(0).key().decode() for _ in range(n)]

    src = source()
    assert read(src, 41) == first
    with pytest.raises(DataLost, match="partition 0 ended"):
        src.take(0)
    src.rewind(0)  # a seek on the assigned partition
    assert read(src, 5) == first[:5]
    state = {**src.state_dict(), "next_offsets": {**src.state_dict()["next_offsets"], "0": m.partitions[0].end_offset}}
    src.close()
    again = source()
    again.load_state_dict(state)  # partition 0 at its end: the new session does not assign it
    again.take(1)
    again.rewind(0)
    assert read(again, 41) == first
    again.close()
