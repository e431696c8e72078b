"""The night's model as a Hugging Face folder: what the line keeps, a person loads and the next night
starts from."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from stoker.layout import TrainerFiles
from stoker.manifest import Manifest


def export(engine: Any, manifest: Manifest, files: TrainerFiles) -> Path:
    """An HF folder loadable offline by ``AutoModelForCausalLM.from_pretrained`` (+ the tokenizer file),
    written by rank 0. Called on every rank: under ZeRO-3 each rank holds only a shard of each weight
    (the module's own tensors are empty placeholders), so the full weights are gathered first, a
    collective that holds the whole model in every rank's memory for the save."""
    import contextlib

    import torch.distributed as dist

    gathered: Any = contextlib.nullcontext()
    if engine.zero_optimization_stage() == 3:
        import deepspeed

        gathered = deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None)
    with gathered:
        if dist.get_rank() == 0:  # new files, swapped in: a joined night's folder holds hard links to the old
            fresh, old = files.export.with_name("hf.new"), files.export.with_name("hf.old")
            shutil.rmtree(fresh, ignore_errors=True)
            engine.module.save_pretrained(str(fresh), safe_serialization=True)
            shutil.copy(manifest.tokenizer_path, fresh / "tokenizer.json")
            shutil.rmtree(old, ignore_errors=True)
            if files.export.exists():
                files.export.rename(old)
            fresh.rename(files.export)
            shutil.rmtree(old, ignore_errors=True)
    return files.export
