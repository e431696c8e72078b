"""The night's model as a Hugging Face folder: what the line keeps, a person loads and the next night
starts from."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from stoker.layout import TrainerFiles
from stoker.run.manifest import Manifest


def export(engine: Any, manifest: Manifest, files: TrainerFiles, target: Path | None = None) -> Path:
    """An HF folder loadable offline by ``AutoModelForCausalLM.from_pretrained`` (+ the tokenizer file),
    written by rank 0. Called on every rank: under ZeRO-3 each rank holds only a shard of each weight
    (the module's own tensors are empty placeholders), so the weights are gathered one layer at a time
    onto rank 0's CPU (DeepSpeed's consolidated state dict, what ``save_16bit_model`` writes), never the
    whole model on any device, nor on the other ranks at all. ``target``: another folder than the export
    (``wsd``'s trunk)."""
    import torch.distributed as dist

    state: dict[str, Any] | None = None
    if engine.zero_optimization_stage() == 3:
        state = engine._zero3_consolidated_16bit_state_dict()  # every rank takes part; rank 0 gets the weights
    if dist.get_rank() == 0:  # new files, swapped in: a joined night's folder holds hard links to the old
        folder = target or files.export
        fresh, old = folder.with_name(folder.name + ".new"), folder.with_name(folder.name + ".old")
        shutil.rmtree(fresh, ignore_errors=True)
        engine.module.save_pretrained(str(fresh), state_dict=state, safe_serialization=True)
        shutil.copy(manifest.tokenizer_path, fresh / "tokenizer.json")
        shutil.rmtree(old, ignore_errors=True)
        if folder.exists():
            folder.rename(old)
        fresh.rename(folder)
        shutil.rmtree(old, ignore_errors=True)
    return target or files.export
