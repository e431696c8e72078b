"""Model lines on the real broker and DeepSpeed: a night continues the line's previous night (its
weights and optimizer), joins the line only when it finished, and a line can start from a local
Hugging Face folder (a DeepSeek-V3 the test pre-trains and saves itself, and a Llama).

The pieces are the train operator's own (``stoker_airflow.lines``): the parent planned at the launch,
the trainer's arguments, the promotion of a finished night."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from stoker.config.corpus import TrainConfig
from stoker.exceptions import StokerError
from stoker.kafka import offsets as koffsets
from stoker.kafka import topics as ktopics
from stoker.layout import LineLayout, RunLayout
from stoker.lines import ledger
from stoker.lines.ledger import head
from stoker.lines.nights import read_night, same_night
from stoker.lines.parents import choose_parent
from stoker_airflow.lines import init_args, join_line, launch_parent
from stoker_local.sample import texts
from tests.support.trainer_tools import (
    decide_ungated,
    launch_logs,
    launch_trainer,
    pretrain_deepseek,
    publish_text_run,
    wait_trainer,
)

pytestmark = pytest.mark.integration
SEQ_LEN = 64


@pytest.fixture(scope="module")
def docs(sample_corpus) -> list[str]:
    return list(texts(sample_corpus["data"]))


def _night(kafka_config, sample_corpus, docs, tmp_path: Path, settings: TrainConfig, ds: str, part: int,
           topics: list[str]) -> dict:
    """Publish a night of real text, train it as the train task does, join it to the line."""
    run = RunLayout(tmp_path / ds)
    m = publish_text_run(kafka_config, sample_corpus["tokenizer"], docs[part * 150:(part + 1) * 150], run.run_dir,
                         ds=ds, seq_len=SEQ_LEN)
    topics.append(m.topic)
    files = run.trainer(m.topic)
    parent = launch_parent(settings, files, m)
    wait_trainer(launch_trainer(run.manifest, files.folder, kafka_config, 1, *init_args(parent), train=settings),
                 files.folder)
    join_line(settings, m, files)
    # joined pending: never the head nor a parent until decided (here as the evaluate task decides a night with
    # no held-out set)
    assert ledger.state(read_night(LineLayout.of(settings.line).night(ds, m.corpus))) == "pending"
    assert not same_night(head(LineLayout.of(settings.line)), {"ds": ds, "corpus": m.corpus})
    summary = json.loads(files.summary.read_text())
    decide_ungated(settings.line, m, Path(summary.get("export") or files.export))
    return {"parent": parent, "summary": summary, "log": launch_logs(files.folder), "manifest": m}


def test_each_night_continues_the_line_and_only_a_finished_night_joins_it(kafka_config, sample_corpus, docs,
                                                                          tmp_path):
    settings = TrainConfig(line=f"it_{time.time_ns()}")
    line = LineLayout.of(settings.line)
    topics: list[str] = []
    try:
        one = _night(kafka_config, sample_corpus, docs, tmp_path, settings, "2026-11-01", 0, topics)
        assert one["parent"].kind == "random" and one["summary"]["first_loss"] > 8.5  # ln(8192) = 9.01
        assert head(line)["ds"] == "2026-11-01"
        two = _night(kafka_config, sample_corpus, docs, tmp_path, settings, "2026-11-02", 1, topics)
        assert (two["parent"].kind, two["parent"].ds) == ("night", "2026-11-01")
        # it continued: night 2 starts where night 1 ended (unseen text of the same kind), not from 9.0
        last = one["summary"]["last_loss"]
        assert abs(two["summary"]["first_loss"] - last) <= 0.10 * last, (two["summary"]["first_loss"], last)
        assert "optimizer state carried from" in two["log"]
        top = head(line)
        assert top["ds"] == "2026-11-02" and [e.get("ds") for e in top["lineage"]] == [None, "2026-11-01",
                                                                                        "2026-11-02"]
        card = line.night("2026-11-02", "lines").card.read_text()
        assert f"`{topics[0]}`" in card and f"`{topics[1]}`" in card and "2 night(s)" in card
        assert Path(two["summary"]["export"], "README.md").read_text() == card  # the run's export has it too
        from stoker.reports.runs import render, summary

        shown = render(summary(tmp_path / "2026-11-02"))  # what `stoker runs show` prints
        assert f"model line       {settings.line}: continued night 2026-11-01 of lines; joined; model card" in shown
        # the line's own copy of night 2 loads offline as a model
        from transformers import AutoModelForCausalLM

        assert AutoModelForCausalLM.from_pretrained(str(line.night("2026-11-02", "lines").model), local_files_only=True)

        # a re-run of night 2 starts from night 1 again, never from its own (half-)trained state
        assert choose_parent(line, "2026-11-02", "lines", "random", "branch").ds == "2026-11-01"
        # a backfill older than the head: a branch from what precedes it, or refused when told to
        older = choose_parent(line, "2026-10-15", "lines", "random", "branch")
        assert (older.kind, older.role) == ("random", "branch")
        with pytest.raises(StokerError, match="cannot continue line .*head, night 2026-11-02"):
            choose_parent(line, "2026-10-15", "lines", "random", "refuse")
        # a night that did not finish never joined: only the two trained nights are in the line
        assert [n.folder.name for n in line.nights()] == ["2026-11-01.lines", "2026-11-02.lines"]
        assert read_night(line.night("2026-11-01", "lines"))["parent"]["kind"] == "random"
    finally:
        ktopics.delete_topics(kafka_config, topics)


def test_a_wsd_line_releases_each_nights_cooldown_and_continues_its_trunk(kafka_config, sample_corpus, docs,
                                                                          tmp_path):
    """``train.lr_schedule: wsd``: a night holds the peak LR and cools down over its last 30% of steps; the line
    keeps the cooled-down model as the night's export and the state before the cooldown (weights and optimizer)
    as its trunk, which the next night continues at the peak LR, without a warm-up."""
    import torch
    from safetensors.torch import load_file

    from training.metrics import read_metrics
    from training.schedule import fork_step

    settings = TrainConfig(line=f"wsd_{time.time_ns()}", lr_schedule="wsd", cooldown_share=0.3)
    line = LineLayout.of(settings.line)
    topics: list[str] = []
    try:
        one = _night(kafka_config, sample_corpus, docs, tmp_path, settings, "2026-11-01", 0, topics)
        files = RunLayout(tmp_path / "2026-11-01").trainer(one["manifest"].topic)
        first = line.night("2026-11-01", "lines")
        assert (first.checkpoint / "latest").read_text() == json.loads(files.fork.read_text())["tag"]
        trunk, cooled = load_file(first.trunk / "model.safetensors"), load_file(first.model / "model.safetensors")
        assert any(not torch.equal(trunk[k], cooled[k]) for k in trunk)  # the cooldown moved the released model

        two = _night(kafka_config, sample_corpus, docs, tmp_path, settings, "2026-11-02", 1, topics)
        assert f"weights from {first.folder}/trunk" in two["log"] and "optimizer state carried from" in two["log"]
        files = RunLayout(tmp_path / "2026-11-02").trainer(two["manifest"].topic)
        lrs = [r["lr"] for r in read_metrics(files.metrics)]  # the LR after each optimizer step (micro-batch 1)
        fork = fork_step(two["summary"]["optimizer_steps"], 0.3)
        assert lrs[:fork - 1] == [pytest.approx(1e-3)] * (fork - 1)  # the peak from the first step: no warm-up
        tail = lrs[fork - 1:]  # down to lr x min_lr_ratio at the night's last step (the row after it: the same)
        assert all(a > b for a, b in zip(tail[:-1], tail[1:-1], strict=False)) and tail[0] < 1e-3
        assert tail[-2] == tail[-1] == pytest.approx(1e-4)
        assert (line.night("2026-11-02", "lines").trunk / "model.safetensors").is_file()
    finally:
        ktopics.delete_topics(kafka_config, topics)


def _first_batch_loss(folder: Path, kafka_config: dict, m) -> float:
    """The HF model's mean loss on the trainer's first batch: one rank, micro-batch 2, so the first record
    of each of the two partitions (the order rule: the least advanced partition first)."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    from stoker.run import records

    firsts = {msg.partition(): msg for msg in koffsets.read_all(kafka_config, m.topic) if msg.offset() == 0}
    rows = torch.tensor(np.stack([records.decode(firsts[p].value(), firsts[p].headers(), m.seq_len).tokens
                                  for p in (0, 1)]).astype("int64"))
    model = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=rows[:, :-1], use_cache=False).logits
    return float(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1)))


def test_a_line_starts_from_a_local_hugging_face_folder_and_continues(kafka_config, sample_corpus, docs, tmp_path):
    start = tmp_path / "pretrained-deepseek"
    pretrained_loss = pretrain_deepseek(sample_corpus["tokenizer"], docs[1000:1400], start, SEQ_LEN)
    settings = TrainConfig(line=f"it_hf_{time.time_ns()}", init=str(start))
    topics: list[str] = []
    try:
        one = _night(kafka_config, sample_corpus, docs, tmp_path, settings, "2026-11-01", 2, topics)
        assert (one["parent"].kind, one["parent"].path) == ("hf", str(start))
        first = one["summary"]["first_loss"]
        # the first step's loss is the saved model's own loss on that batch (computed before any update):
        # the weights came from the folder, not from a random start (ln 8192 = 9.01)
        expected = _first_batch_loss(start, kafka_config, one["manifest"])
        assert first == pytest.approx(expected, rel=1e-3) and first < 8.5 and pretrained_loss < 8.0, (first, expected)
        assert "optimizer state carried" not in one["log"]  # an HF folder has none: fresh, as documented
        card = LineLayout.of(settings.line).night("2026-11-01", "lines").card.read_text()
        assert str(start) in card
    finally:
        ktopics.delete_topics(kafka_config, topics)


def test_a_line_starts_from_a_llama_folder(kafka_config, sample_corpus, docs, tmp_path):
    """Other causal LMs load the same way (no expert balancing: they have no routers)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    start = tmp_path / "llama"
    LlamaForCausalLM(LlamaConfig(vocab_size=8192, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                 eos_token_id=None, pad_token_id=None, bos_token_id=None)).save_pretrained(str(start))
    settings = TrainConfig(line=f"it_llama_{time.time_ns()}", init=str(start))
    topics: list[str] = []
    try:
        one = _night(kafka_config, sample_corpus, docs, tmp_path, settings, "2026-11-01", 3, topics)
        s = one["summary"]
        assert s["sequences_consumed"] == one["manifest"].sequences and s["last_loss"] < s["first_loss"]
        night = LineLayout.of(settings.line).night("2026-11-01", "lines")
        saved = json.loads((night.model / "config.json").read_text())
        assert saved["architectures"] == ["LlamaForCausalLM"]
    finally:
        ktopics.delete_topics(kafka_config, topics)
