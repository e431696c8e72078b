"""Held-out evaluation: a packed held-out set scored by the trainer's batch builder gives each document the
loss it has when scored on its own (no attention across documents), and bits per byte follow from it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from spark_jobs.steps import Packer
from stoker.run.holdout import HoldoutPart

pytestmark = pytest.mark.integration
SEQ_LEN, EOS, PAD, VOCAB = 32, 0, 1, 8192


@pytest.fixture(scope="module")
def model():
    from stoker.config.recipes import get_recipe
    from training.model import build_model

    return build_model(get_recipe("debug_cpu"), VOCAB, SEQ_LEN, EOS, PAD).eval()


def _held_out_set(tmp_path, docs: list[list[int]], sources: list[str]):
    part = HoldoutPart(packer=Packer(SEQ_LEN, EOS, PAD))
    for ids, src in zip(docs, sources, strict=True):
        part.add(src, ids, "x" * (3 * len(ids)))  # 3 bytes a token
    part.write(tmp_path / "holdout", 0, "uint16")
    return tmp_path / "holdout"


def _alone(model, docs: list[list[int]]) -> np.ndarray:
    """Each document scored on its own: every window's piece of it as a separate input, positions from 0."""
    import torch
    import torch.nn.functional as F

    stream = [t for d in docs for t in [*d, EOS]]
    width, at, out = SEQ_LEN + 1, 0, []
    for d in docs:
        start, end, loss = at, at + len(d) + 1, 0.0
        for lo in range(start - start % width, end, width):  # the windows the document lies in
            seg = torch.tensor(stream[max(start, lo):min(end, lo + width)]).unsqueeze(0)
            if seg.shape[1] > 1:
                with torch.no_grad():
                    logits = model(input_ids=seg[:, :-1], position_ids=torch.arange(seg.shape[1] - 1).unsqueeze(0),
                                   use_cache=False).logits
                loss += float(F.cross_entropy(logits[0].float(), seg[0, 1:], reduction="sum"))
        out.append(loss)
        at = end
    return np.array(out)


def test_a_packed_document_scores_as_it_does_alone_and_bits_per_byte_follow(model, tmp_path):
    from training.evaluate import HeldOut, document_losses, figures

    rng = np.random.default_rng(7)
    lengths = [5, 40, 3, 17, 70, 9, 1, 28]  # some inside a window, some across two or three
    docs = [rng.integers(2, VOCAB, n).tolist() for n in lengths]
    sources = ["a", "b", "a", "a", "b", "b", "a", "b"]
    held = HeldOut.load(_held_out_set(tmp_path, docs, sources))
    got = document_losses(model, held, batch_size=3)
    want = _alone(model, docs)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)

    f = figures(held, got, baseline=got * 1.1)
    assert math.isclose(f["all"]["bpb"], want.sum() / math.log(2) / (3 * sum(lengths)), rel_tol=1e-3)
    a = [i for i, s in enumerate(sources) if s == "a"]
    assert math.isclose(f["sources"]["a"]["bpb"], want[a].sum() / math.log(2) / (3 * sum(lengths[i] for i in a)),
                        rel_tol=1e-3)
    assert f["all"]["stderr"] > 0 and f["all"]["docs"] == 8 and f["all"]["bytes"] == 3 * sum(lengths)
    assert math.isclose(f["all"]["delta"], -0.1 / 1.1 * f["all"]["baseline_bpb"], rel_tol=1e-6)  # paired


def test_the_command_scores_a_model_folder_against_a_baseline(model, tmp_path):
    from training.evaluate import main

    rng = np.random.default_rng(3)
    folder = _held_out_set(tmp_path, [rng.integers(2, VOCAB, n).tolist() for n in (12, 30, 7)], ["s"] * 3)
    HoldoutPart(packer=Packer(SEQ_LEN, EOS, PAD)).write(folder, 1, "uint16")  # a task that held out nothing
    model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    assert main(["--model", str(tmp_path / "hf"), "--baseline", str(tmp_path / "hf"), "--set", f"night={folder}",
                 "--out", str(tmp_path / "eval.json")]) == 0
    night = json.loads((tmp_path / "eval.json").read_text())["sets"]["night"]
    assert night["all"]["docs"] == 3 and night["all"]["bpb"] == night["all"]["baseline_bpb"] > 0
    assert night["all"]["delta"] == 0 and list(night["sources"]) == ["s"]


def test_lm_eval_tasks_run_offline_on_a_local_task_and_tell_a_trained_model_from_a_random_one(sample_corpus,
                                                                                               tmp_path):
    """``eval.lm_eval_tasks`` through the command the evaluate step runs: Stoker's own local task
    (corpora/examples/lm_eval: 48 docstring sentences missing their last word), with no network (offline flags
    and an unreachable proxy), started from another folder. A model pre-trained on the task's sentences scores
    far above the random-weights baseline on the same documents; an unknown task or a missing task folder fails
    naming itself and the setting to fix, before any model loads."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from tests.support.trainer_tools import pretrain_deepseek

    repo = Path(__file__).resolve().parents[2]
    include = repo / "corpora" / "examples" / "lm_eval"
    items = [json.loads(line) for line in (include / "stoker_cloze.jsonl").read_text().splitlines()]
    sentences = [f"{it['context']} {it['choices'][it['answer']]}." for it in items]
    for name, steps in (("trained", 40), ("random", 0)):
        pretrain_deepseek(sample_corpus["tokenizer"], sentences * 4, tmp_path / name, 64, steps=steps)
        shutil.copy(sample_corpus["tokenizer"], tmp_path / name / "tokenizer.json")
    env = {**os.environ, "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home"),
           "PYTHONPATH": str(repo)}

    def harness(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "training.lm_eval_tasks", "--include", str(include), *args],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)

    out = harness("--model", str(tmp_path / "trained"), "--baseline", str(tmp_path / "random"),
                  "--task", "stoker_cloze", "--limit", "40", "--out", str(tmp_path / "lm_eval.json"))
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "lm_eval.json").read_text())
    row = result["tasks"]["stoker_cloze"]
    assert row["docs"] == 40 and set(row["metrics"]) == {"acc", "acc_norm"}
    acc = row["metrics"]["acc"]
    assert acc["value"] >= 0.9 and acc["baseline"] <= 0.6, acc  # four choices: chance is 0.25
    assert 0 < acc["baseline_stderr"] < 0.2 and acc["stderr"] is not None

    from training.lm_eval_tasks import task_manager

    with pytest.raises(ValueError, match=r"nosuch_task.*set eval.lm_eval_include"):
        task_manager(["stoker_cloze", "nosuch_task"], str(include))
    with pytest.raises(FileNotFoundError, match="eval.lm_eval_include = .* is not a folder"):
        task_manager(["stoker_cloze"], str(tmp_path / "nowhere"))
