"""The learning rate across a night for ``train.lr_schedule: wsd`` (warmup-stable-decay for continual runs).

A line's nights hold the peak LR (the stable phase; the line's first night warms up to it). The last
``train.cooldown_share`` of a night's optimizer steps decay it linearly to the recipe's ``min_lr_ratio`` x lr:
the night's released model (its export, its evaluation, the gate) is that cooled-down branch. Right before the
cooldown the trainer keeps the *trunk*, the weights (an HF folder) and the checkpoint tag with the optimizer
state; the next night continues the trunk at the peak LR, so no night starts from a decayed model and no
cooldown is undone by the next warm-up (Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training Beyond
Fixed Training Durations"). The trunk does not learn the cooldown's sequences; they are ``cooldown_share`` of
each night's data.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stoker.config.corpus import LrSchedule

if TYPE_CHECKING:
    from stoker.config.recipes import TrainRecipe


def fork_step(total: int, share: float) -> int:
    """The optimizer step count at which the cooldown starts (the trunk's last state): at least one step of
    cooldown, so a night of one step forks at 0 (its trunk is the state it started from)."""
    return max(0, total - max(1, math.ceil(share * total)))


def fork_due(step: int, fork: int | None, forked: bool) -> bool:
    """Whether the trainer keeps its trunk now, at optimizer step ``step``: at the fork, or past it when the night
    has not forked yet. A relaunch at another world size recomputes the night's steps (the global batch changed),
    so a resume can land past the new fork step; its state was trained at the peak LR of the old schedule, so it
    is the trunk (before, no trunk was kept and the next night continued the cooled-down model)."""
    return fork is not None and not forked and step >= fork


def wsd_factor(step: int, *, warmup: int, fork: int, total: int, min_ratio: float) -> float:
    """The LR multiplier of optimizer step ``step`` (0-based): linear warm-up over ``warmup`` steps, 1 until
    ``fork``, then linear down to ``min_ratio`` at the night's last step."""
    if step < min(warmup, fork):
        return (step + 1) / warmup
    if step < fork:
        return 1.0
    done = min(1.0, (step - fork + 1) / max(1, total - fork))
    return 1.0 - (1.0 - min_ratio) * done


def wsd_scheduler(*, warmup: int, fork: int, total: int, min_ratio: float) -> Callable[[Any], Any]:
    """For ``deepspeed.initialize(lr_scheduler=...)``: a ``LambdaLR`` over the engine's optimizer (its state,
    the step count, is saved and restored with every checkpoint)."""
    def build(optimizer: Any) -> Any:
        from torch.optim.lr_scheduler import LambdaLR

        return LambdaLR(optimizer, lambda s: wsd_factor(s, warmup=warmup, fork=fork, total=total,
                                                        min_ratio=min_ratio))
    return build


def ds_config(recipe: TrainRecipe, total_steps: int, scheduled: bool = True) -> dict[str, Any]:
    """DeepSpeed's config; not ``scheduled``: the recipe's LR throughout, no warm-up."""
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": recipe.micro_batch_size,
        "gradient_accumulation_steps": recipe.grad_accum_steps,
        "gradient_clipping": recipe.grad_clip,
        "optimizer": {"type": "AdamW", "params": {
            "lr": recipe.lr, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": recipe.weight_decay,
            "torch_adam": recipe.torch_adam}},
        "zero_optimization": {"stage": recipe.zero_stage},
        "bf16": {"enabled": recipe.bf16},
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    if scheduled:
        config["scheduler"] = {"type": "WarmupCosineLR", "params": {
            "total_num_steps": max(total_steps, recipe.warmup_steps + 1), "warmup_num_steps": recipe.warmup_steps,
            "warmup_min_ratio": 0.0, "cos_min_ratio": recipe.min_lr_ratio}}
    return config


def lr_plan(recipe: TrainRecipe, lr_schedule: LrSchedule, cooldown_share: float, total: int,
            continuing: bool) -> tuple[dict[str, Any], Callable[[Any], Any] | None, int | None]:
    """A night of ``total`` optimizer steps: DeepSpeed's config, the client LR scheduler (``wsd``) and the step
    its trunk forks at (``wsd``). ``continuing``: the night continues a night of its line (no warm-up for
    ``constant`` and ``wsd``)."""
    if lr_schedule != LrSchedule.WSD:
        return ds_config(recipe, total, not (lr_schedule == LrSchedule.CONSTANT and continuing)), None, None
    fork = fork_step(total, cooldown_share)
    return ds_config(recipe, total, scheduled=False), wsd_scheduler(
        warmup=0 if continuing else recipe.warmup_steps, fork=fork, total=total, min_ratio=recipe.min_lr_ratio), fork
