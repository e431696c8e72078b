"""The trainer in the shapes users run, on the real broker: gradient accumulation (both GPU recipes
accumulate) under ZeRO 2 and 3, killed at a random micro-step inside a window and resumed.

Every key is trained once, counted against Kafka's own ConsoleConsumer, and only keys whose optimizer
step ran count as trained; the optimizer steps equal an uninterrupted run's (the last, partial window is
stepped too); a checkpoint is only ever taken on an optimizer step."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from stoker.kafka import offsets as koffsets
from stoker.kafka import topics as ktopics
from stoker.kafka.lag import compute_lag
from stoker.run.records import make_key
from tests.support.trainer_tools import (
    await_step,
    committed_keys,
    keys_by_step,
    kill_tree,
    launch_logs,
    launch_trainer,
    publish_run,
    resume_step,
    wait_trainer,
)
from training.metrics import read_metrics

pytestmark = pytest.mark.integration
PARTITIONS, PER_PARTITION, ACCUM = 4, 41, 4
MICRO_STEPS = PARTITIONS * PER_PARTITION // 4  # 2 ranks x 2 sequences a micro-step: 41, the last window short


@pytest.fixture(scope="module")
def published(kafka_config, sample_corpus, tmp_path_factory):
    """One run topic for the module (each test trains it under a group of its own), and the keys Kafka's
    own ConsoleConsumer reads from it: the reference."""
    folder = tmp_path_factory.mktemp("run")
    m = publish_run(kafka_config, sample_corpus["tokenizer"], folder, partitions=PARTITIONS,
                    per_partition=PER_PARTITION)
    reference = sorted(k.decode() for k in committed_keys(kafka_config["bootstrap.servers"], m.topic))
    assert len(reference) == m.sequences
    yield m, folder / "manifest.json", kafka_config, reference
    ktopics.delete_topics(kafka_config, [m.topic])


@pytest.fixture()
def run(kafka_config, sample_corpus, tmp_path):
    """A topic of this test's own (it is hurt)."""
    m = publish_run(kafka_config, sample_corpus["tokenizer"], tmp_path / "run", partitions=PARTITIONS,
                    per_partition=PER_PARTITION)
    yield m, tmp_path / "run" / "manifest.json", kafka_config
    ktopics.delete_topics(kafka_config, [m.topic])


def rows(out: Path, suffix: str = ".jsonl") -> list[dict]:
    """Every row of the keys audit logs, with its rank."""
    found = []
    for f in sorted(out.glob(f"keys.*{suffix}")):
        for line in f.read_text().splitlines():
            try:
                found.append({"rank": int(f.name.split(".")[1]), **json.loads(line)})
            except json.JSONDecodeError:  # a killed rank's torn last line
                continue
    return found


@pytest.mark.parametrize("zero", [2, 3])  # ZeRO-1 is DeepSpeed's same optimizer as ZeRO-2 (stage_1_and_2.py,
# gradients not partitioned): bench/gpu_bench.py runs it on a GPU; the suite keeps its minutes for 2 and 3
def test_accumulation_killed_mid_window_resumes_with_every_key_once(published, tmp_path, zero):
    m, path, kafka_config, reference = published
    shape = ["--set", f"grad_accum_steps={ACCUM}", "--set", f"zero_stage={zero}", "--checkpoint-every", "3",
             "--group-id", f"accum-{zero}",
             # as the GPU recipes, and compiled (recipe.compile): a compiled night resumes exactly too
             *(["--set", "bf16=true", "--set", "compile=true"] if zero == 2 else [])]
    out = tmp_path / "train"
    # checkpoints every 12 micro-steps; killed inside the window just after one, or inside the next (the resume
    # then trains a whole window again), past the first (12) and 5 or more micro-steps before the next: a kill
    # that lands late must not pass a checkpoint whose next step the killed life never logged
    kill_at = random.Random().choice([s for s in range(13, 32) if s % (3 * ACCUM) in (1, 2, 3, 5, 6, 7)])
    proc = launch_trainer(path, out, kafka_config, 2, *shape)
    await_step(out, kill_at, proc)
    kill_tree(proc)
    ckpt_step = resume_step(out)
    tags = sorted(d.name for d in (out / "checkpoints").iterdir() if d.is_dir())
    assert ckpt_step and all(int(t.removeprefix("step")) % ACCUM == 0 for t in tags), \
        f"checkpoints {tags} taken inside an accumulation window (killed at {kill_at})"
    first = rows(out)
    losses = {r["step"]: r["loss"] for r in read_metrics(out / "metrics.jsonl")}
    # a window's keys are logged only once its optimizer step ran: none of the killed window's
    assert all(r["step"] <= r["optimizer_step"] * ACCUM for r in first), first[-2:]
    for f in out.glob("keys.*.jsonl"):
        f.rename(f.with_suffix(".first"))

    wait_trainer(launch_trainer(path, out, kafka_config, 2, *shape), out)
    second = rows(out)
    assert min(r["step"] for r in second) == ckpt_step + 1, launch_logs(out)
    trained = [k for r in rows(out, ".first") if r["step"] <= ckpt_step for k in r["keys"]]
    trained += [k for r in second for k in r["keys"]]
    assert sorted(trained) == reference  # every key once, none twice
    summary = json.loads((out / "train_summary.json").read_text())
    # an uninterrupted run steps once per window, the last (short) one included
    assert summary["optimizer_steps"] == math.ceil(MICRO_STEPS / ACCUM), summary
    assert max(r["optimizer_step"] for r in second) == math.ceil(MICRO_STEPS / ACCUM)
    # and the batches are the uninterrupted run's: rank r trains partitions r and r+2, s-th record of each
    by_rank_step = {(r["rank"], r["step"]): r["keys"] for r in second}
    assert by_rank_step == {(r, s): [make_key(0, 4 * (s - 1) + p).decode() for p in (r, r + 2)]
                            for r in (0, 1) for s in range(ckpt_step + 1, MICRO_STEPS + 1)}
    committed = koffsets.committed_offsets(kafka_config, f"accum-{zero}", m.topic, range(PARTITIONS))
    assert compute_lag(m.end_offsets(), committed).lag == 0
    # same weights, optimizer and data after the checkpoint: the resumed loss continues the killed life's curve
    resumed = {r["step"]: r["loss"] for r in read_metrics(out / "metrics.jsonl") if r["step"] > ckpt_step}
    assert resumed[ckpt_step + 1] == pytest.approx(losses[ckpt_step + 1], rel=1e-3)
    # old checkpoints are pruned (keep_checkpoints = 2): the final one and the one before it remain, and the
    # tag before the cooldown (wsd, the default schedule: the line's trunk), on an optimizer step too
    tags = sorted(d.name for d in (out / "checkpoints").iterdir() if d.is_dir())
    fork = json.loads((out / "checkpoints" / "fork.json").read_text())["tag"]
    assert fork in tags and int(fork.removeprefix("step")) % ACCUM == 0
    rest = [t for t in tags if t != fork]
    assert len(rest) in (1, 2) and rest[-1] == f"step{MICRO_STEPS:08d}"  # the padding micro-steps count no step
    assert len(rest) == 2 or tags[-2] == fork, tags
    if zero == 2:  # both lives compiled their layers
        logs = [p.read_text(errors="replace") for p in sorted(out.glob("launch-*.log"))]
        assert len(logs) == 2 and all("compiling its decoder layers" in t for t in logs), [t[-500:] for t in logs]
    if zero == 2:  # under bf16 the routers' selection biases stay fp32 (DeepSpeed casts parameters, not buffers):
        from safetensors import safe_open  # in bf16 a bias >= 0.5 could not move by gamma = 1e-3

        with safe_open(str(Path(summary["export"]) / "model.safetensors"), "pt") as f:
            dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
        assert {d for k, d in dtypes.items() if k.endswith("e_score_correction_bias")} == {"F32"}
        assert dtypes["model.embed_tokens.weight"] == "BF16"
    if zero == 3:  # the export holds the gathered weights, not ZeRO-3's empty placeholders
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(summary["export"], local_files_only=True)
        assert all(p.numel() > 0 for p in model.parameters())
        assert model.model.embed_tokens.weight.shape == (m.vocab_size, 128)  # debug_cpu's hidden size


def test_max_steps_inside_a_window_finishes_the_window(published, tmp_path):
    """``--max-steps`` that falls inside a window trains to the window's end: the checkpoint it leaves is
    on an optimizer step, and the keys it logs are exactly the ones stepped."""
    m, path, kafka_config, _ = published
    out = tmp_path / "train"
    wait_trainer(launch_trainer(path, out, kafka_config, 2, "--set", f"grad_accum_steps={ACCUM}",
                                "--max-steps", "6", "--group-id", "accum-max"), out)
    assert (out / "checkpoints" / "latest").read_text().strip() == "step00000008"
    assert sorted(keys_by_step(out)) == list(range(1, 9))
    assert json.loads((out / "train_summary.json").read_text())["optimizer_steps"] == 2


def test_records_deleted_before_training_read_them_fail_the_night(run, tmp_path):
    """Retention deleted the start of a partition before the trainer read it (here: DeleteRecords, the
    same log-start move). The trainer must not jump to the end and report lag 0: it fails naming the
    partition and offsets, says no relaunch can help, and leaves the group's offsets short of the end."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    from stoker.layout import TrainerFiles

    m, path, kafka_config = run
    admin = AdminClient(kafka_config)  # held: a collected client never completes its futures
    for f in admin.delete_records([TopicPartition(m.topic, 1, 20)]).values():
        f.result(30)
    out = tmp_path / "train"
    proc = launch_trainer(path, out, kafka_config, 2, "--group-id", "expired")
    assert proc.wait(timeout=600) != 0, launch_logs(out)
    failure = json.loads(TrainerFiles(out).failure.read_text())
    assert failure["reason"] == "data_lost"
    assert f"{m.topic} partition 1: offset 0 is no longer in the topic (its earliest offset is now 20" in \
        failure["message"], failure
    committed = koffsets.committed_offsets(kafka_config, "expired", m.topic, range(PARTITIONS))
    assert compute_lag(m.end_offsets(), committed).lag > 0


def test_a_zero3_export_is_the_zero0_export_of_the_same_weights(published, tmp_path):
    """A parent loaded and exported at once (``--max-steps 0``) under ZeRO-0 and ZeRO-3, two ranks each: both
    exports are the parent's weights, tensor for tensor. Under ZeRO-3 the parent is loaded into each rank's
    shard (``zero.Init``), never whole on a rank, and exported one layer at a time onto rank 0."""
    import torch
    from safetensors.torch import load_file

    from stoker.config.recipes import debug_cpu
    from training.model import build_model, special_ids

    m, path, kafka_config, _ = published
    parent = tmp_path / "parent"
    build_model(debug_cpu(), m.vocab_size, m.seq_len, *special_ids(m)).save_pretrained(parent, safe_serialization=True)
    weights = load_file(parent / "model.safetensors")
    total = sum(t.numel() for k, t in weights.items() if not k.endswith("e_score_correction_bias"))  # buffers
    exports, held, peaks = {}, {}, {}
    for zero in (0, 3):
        out = tmp_path / f"zero{zero}"
        wait_trainer(launch_trainer(path, out, kafka_config, 2, "--init-from", str(parent), "--max-steps", "0",
                                    "--set", f"zero_stage={zero}", "--group-id", f"export-{zero}"), out)
        summary = json.loads((out / "train_summary.json").read_text())
        exports[zero] = load_file(Path(summary["export"]) / "model.safetensors")
        held[zero] = [r["parameters_held_at_load"] for r in summary["ranks"]]
        peaks[zero] = [r["peak_rss_mib"] for r in summary["ranks"]]
    assert exports[0].keys() == exports[3].keys() == weights.keys()
    for key, tensor in weights.items():
        assert torch.equal(exports[3][key], exports[0][key]) and torch.equal(exports[0][key], tensor), key
    assert held[0] == [total, total]  # ZeRO-0: the whole model on each rank
    assert sum(held[3]) >= total and max(held[3]) < 0.6 * total, held[3]  # ZeRO-3: about half each, from the load
    print(f"peak RSS per rank, MiB: ZeRO-0 {peaks[0]}, ZeRO-3 {peaks[3]}")


def test_a_trainer_killed_inside_save_checkpoint_resumes_from_the_complete_one_before(published, tmp_path,
                                                                                       monkeypatch):
    """Rank 0 dies (SIGKILL) inside DeepSpeed's save_checkpoint of step 6, its model states written and its
    optimizer's not: the half-saved tag is never complete, the relaunch resumes from step 3 (the last complete
    one), saves step 6 again whole, and every key is trained once."""
    from stoker.layout import CHECKPOINT_COMPLETE
    from training.checkpoint import KILL_IN_SAVE_ENV

    m, path, kafka_config, reference = published
    out, shape = tmp_path / "train", ["--checkpoint-every", "3", "--group-id", "save-kill"]
    monkeypatch.setenv(KILL_IN_SAVE_ENV, "6")
    proc = launch_trainer(path, out, kafka_config, 2, *shape)
    assert proc.wait(timeout=600) != 0, launch_logs(out)
    half = out / "checkpoints" / "step00000006"
    assert half.is_dir() and any(half.iterdir()) and not (half / CHECKPOINT_COMPLETE).exists(), launch_logs(out)
    assert resume_step(out) == 3
    first = [k for r in rows(out) if r["step"] <= 3 for k in r["keys"]]
    for f in out.glob("keys.*.jsonl"):
        f.rename(f.with_suffix(".first"))

    monkeypatch.delenv(KILL_IN_SAVE_ENV)
    wait_trainer(launch_trainer(path, out, kafka_config, 2, *shape), out)
    second = rows(out)
    assert min(r["step"] for r in second) == 4, launch_logs(out)
    assert sorted(first + [k for r in second for k in r["keys"]]) == reference  # every key once
    tags = sorted(d.name for d in (out / "checkpoints").iterdir() if d.is_dir())
    assert all((out / "checkpoints" / t / CHECKPOINT_COMPLETE).is_file() for t in tags), tags
