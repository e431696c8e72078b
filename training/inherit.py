"""Where a night's model comes from (``stoker.lines``): random weights in the recipe's shape, a local
Hugging Face folder, or the parent night of its line (its HF export for the weights, its DeepSpeed
checkpoint for the optimizer state when ``train.optimizer: carry``).

Policies across nights (the corpus's ``train.optimizer`` and ``train.lr_schedule``):

* ``carry`` restores the parent night's AdamW moments; where DeepSpeed cannot load them (another
  ZeRO world size, or a start from an HF folder, which has none) the optimizer starts fresh, logged.
* ``rewarm`` gives every night a fresh warm-up and cosine decay over its own steps; ``constant``
  warms up on the line's first night only and holds the peak LR from then on; ``wsd`` holds it too and
  cools each night down at its end, the next night continuing the state before the cooldown (its trunk:
  training/schedule.py).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from stoker.config.recipes import TrainRecipe
from stoker.layout import NightFiles

log = logging.getLogger("stoker.train.inherit")


def is_night(init_from: str | None) -> bool:
    return bool(init_from) and NightFiles(Path(str(init_from))).record.is_file()


def model_folder(init_from: str) -> Path:
    """The weights a night continues: a ``wsd`` night's trunk (before its cooldown), else its export."""
    if not is_night(init_from):
        return Path(init_from)
    night = NightFiles(Path(init_from))
    return night.trunk if night.trunk.is_dir() else night.model


def load_model(init_from: str, seq_len: int, vocab_size: int, ds_config: dict[str, Any] | None = None) -> Any:
    """The parent's weights, offline, in fp32 (DeepSpeed casts for bf16 itself).

    Under ZeRO-3 (``ds_config``'s stage) the model is built inside ``deepspeed.zero.Init`` and each weight is
    loaded into the ranks' shards one at a time: ``from_pretrained`` does both while a ``HfDeepSpeedConfig`` of
    the run's config is alive. A model that needs ZeRO-3 would not fit a rank whole, as it did before."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = model_folder(init_from)
    zero3: Any = None
    if ds_config is not None and int(ds_config.get("zero_optimization", {}).get("stage", 0)) == 3:
        from transformers.integrations import HfDeepSpeedConfig

        zero3 = HfDeepSpeedConfig(ds_config)  # transformers keeps only a weak reference: held until loaded
    model = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True, dtype=torch.float32)
    del zero3
    cfg = model.config
    if int(cfg.vocab_size) < vocab_size:
        raise ValueError(f"{folder}: the model has {cfg.vocab_size} embeddings but the run's tokenizer has "
                         f"{vocab_size} ids: train it with the model's own tokenizer")
    limit = getattr(cfg, "max_position_embeddings", None)
    if limit is not None and seq_len > int(limit):
        log.warning("%s: seq_len %d is beyond the model's max_position_embeddings %d", folder, seq_len, limit)
    cfg.use_cache = False
    log.info("weights from %s (%s, %.1fM parameters, %.1fM of them on this rank)", folder, type(model).__name__,
             sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters()) / 1e6, held_parameters(model) / 1e6)
    return model


def held_parameters(model: Any) -> int:
    """The parameter elements this rank holds: under ZeRO-3 (``zero.Init``) its partitions, else all of them."""
    return sum(int(p.ds_tensor.numel()) if hasattr(p, "ds_tensor") else p.numel() for p in model.parameters())


def carry_optimizer(engine: Any, init_from: str | None, recipe: TrainRecipe) -> bool:
    """Restore the parent night's optimizer state into a fresh engine; whether it could."""
    if not is_night(init_from):
        return False
    ckpt = NightFiles(Path(str(init_from))).checkpoint
    try:
        path, _ = engine.load_checkpoint(str(ckpt), load_optimizer_states=True, load_lr_scheduler_states=False,
                                         load_module_strict=True)
    except Exception as e:  # noqa: BLE001 - a ZeRO-partitioned state saved at another world size
        log.warning("the parent's optimizer state could not be restored (%s): it starts fresh", e)
        return False
    if path is None:
        log.warning("no checkpoint in %s: the optimizer starts fresh", ckpt)
        return False
    engine.global_steps = engine.global_samples = engine.skipped_steps = 0  # this night's own counters
    sched = engine.lr_scheduler
    if hasattr(sched, "last_batch_iteration"):  # the loaded param groups carry the parent's last LR: ours wins
        sched.step(sched.last_batch_iteration)
    elif sched is not None:  # a torch scheduler (wsd): its LR of this step
        for group, lr in zip(engine.optimizer.param_groups, sched.get_last_lr(), strict=False):
            group["lr"] = lr
    else:
        for group in engine.optimizer.param_groups:
            group["lr"] = recipe.lr
    log.info("optimizer state carried from %s", path)
    return True
