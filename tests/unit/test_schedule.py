"""``train.lr_schedule: wsd``: the LR of a night (stable, then a cooldown at its end), where its trunk forks,
and what of the trunk the line keeps (its checkpoint tag through pruning, its weights for the next night)."""

from __future__ import annotations

import json

import pytest

from stoker.config.corpus import TrainConfig
from stoker.exceptions import ConfigError
from stoker.layout import CHECKPOINT_COMPLETE, FORK_FILE, NightFiles
from training.schedule import fork_due, fork_step, lr_plan, wsd_factor

pytestmark = pytest.mark.unit


def test_a_wsd_night_holds_the_peak_then_cools_down_over_its_last_share():
    assert fork_step(20, 0.1) == 18 and fork_step(20, 0.34) == 13 and fork_step(1, 0.1) == 0
    f = [wsd_factor(s, warmup=0, fork=18, total=20, min_ratio=0.1) for s in range(20)]
    assert f[:18] == [1.0] * 18 and f[18] == pytest.approx(0.55) and f[19] == pytest.approx(0.1)
    first = [wsd_factor(s, warmup=4, fork=18, total=20, min_ratio=0.1) for s in range(6)]
    assert first == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]  # the line's first night warms up
    # a night shorter than its warm-up still cools down at its end
    assert wsd_factor(2, warmup=10, fork=2, total=3, min_ratio=0.0) == 0.0


def test_the_plan_gives_deepspeed_no_scheduler_of_its_own_for_wsd():
    from stoker.config.recipes import debug_cpu

    recipe = debug_cpu()
    config, client, fork = lr_plan(recipe, "wsd", 0.25, 40, continuing=True)
    assert "scheduler" not in config and client is not None and fork == 30
    config, client, fork = lr_plan(recipe, "rewarm", 0.25, 40, continuing=True)
    assert config["scheduler"]["type"] == "WarmupCosineLR" and client is None and fork is None
    assert "scheduler" not in lr_plan(recipe, "constant", 0.25, 40, continuing=True)[0]
    with pytest.raises(ConfigError, match=r"train.cooldown_share = 0.9: must be in \(0, 0.5\]"):
        TrainConfig(lr_schedule="wsd", cooldown_share=0.9)


def test_pruning_keeps_the_trunk_and_the_line_joins_it(tmp_path):
    from stoker.layout import LineLayout
    from stoker.lines.nights import Night
    from stoker.lines.promotion import promote
    from training.checkpoint import prune
    from training.inherit import model_folder

    ckpts = tmp_path / "checkpoints"
    for step in (3, 6, 9, 12):
        (ckpts / f"step{step:08d}").mkdir(parents=True)
        (ckpts / f"step{step:08d}" / CHECKPOINT_COMPLETE).write_text("{}")
    (ckpts / FORK_FILE).write_text(json.dumps({"tag": "step00000006", "step": 6}))
    assert prune(ckpts, 1) == ["step00000003", "step00000009"]  # the trunk's tag stays
    export, trunk = tmp_path / "hf", tmp_path / "trunk"
    for folder, weights in ((export, b"cooled"), (trunk, b"trunk")):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(weights)
    night = Night(line="l", ds="2026-12-01", corpus="c", topic="t", publication="p", parent={"kind": "random"},
                  tokenizer={"path": "t.json", "sha256": "0", "vocab_size": 8192, "eos_id": 0, "pad_id": 1},
                  recipe="debug_cpu", world_size=1, steps=12, sequences=48, tokens=3072,
                  first_loss=9.0, last_loss=7.0, offsets={"0": [0, 48]})
    done = NightFiles(promote(LineLayout(tmp_path / "line"), night, ckpts, export, trunk=trunk).folder.resolve())
    assert (done.checkpoint / "latest").read_text() == "step00000006"  # the optimizer state before the cooldown
    assert (done.trunk / "model.safetensors").read_bytes() == b"trunk"
    assert (done.model / "model.safetensors").read_bytes() == b"cooled"  # the released model
    assert model_folder(str(done.folder)) == done.trunk  # the next night continues the trunk


def test_a_night_relaunched_past_its_new_fork_step_still_keeps_its_trunk():
    """Killed at step 30 of a 60-step night (world 1, fork at 54), relaunched at world 4: the night is 15 steps
    now, its fork at 13, and the resume is at step 30. The trunk is kept at once (the state was trained at the peak
    LR); before, the trainer forked only at exactly the fork step, kept no trunk, and the next night continued the
    cooled-down model."""
    assert fork_step(60, 0.1) == 54 and fork_step(15, 0.1) == 13
    assert fork_due(30, fork_step(15, 0.1), forked=False)  # past the new fork, not forked: now
    assert not fork_due(30, fork_step(15, 0.1), forked=True)  # it forked before the kill: the trunk stands
    assert not fork_due(12, 13, forked=False) and fork_due(13, 13, forked=False)
    assert not fork_due(5, None, forked=False)  # not wsd
