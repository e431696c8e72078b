"""Checkpoints that hold the data state: model, optimizer and scheduler (DeepSpeed) plus every
rank's Kafka offsets (client state), then the offsets committed to the training consumer group so
the lag sensor sees progress.

DeepSpeed saves only rank 0's ``client_state``, so the ranks' source states are gathered first.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

from stoker import kafka as skafka

log = logging.getLogger("stoker.train.checkpoint")

TAG = re.compile(r"step\d{8}")


def merge_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """One data state for the run: each partition's offset from the rank that owns it."""
    merged = dict(states[0])
    offsets = dict(states[0]["next_offsets"])
    for s in states:
        for p in s["assignment"]["partitions"]:
            offsets[str(p)] = s["next_offsets"][str(p)]
    merged["next_offsets"] = offsets
    merged["assignment"] = {"world": states[0]["assignment"]["world"],
                            "ranks": [s["assignment"]["partitions"] for s in states]}
    return merged


def save(engine: Any, source: Any, step: int, ckpt_dir: Path, *, kafka_config: dict[str, Any] | None,
         group_id: str, keep: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    import torch.distributed as dist

    states: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(states, source.state_dict())
    data = merge_states(states)
    engine.save_checkpoint(str(ckpt_dir), tag=f"step{step:08d}",
                           client_state={"data": data, "step": step, **(extra or {})})
    dist.barrier()
    if dist.get_rank() == 0 and kafka_config is not None:
        offsets = {int(p): o for p, o in data["next_offsets"].items()}
        skafka.commit_offsets(kafka_config, group_id, data["topic"], offsets)
        log.info("checkpoint step %d saved in %s; offsets committed for group %s: %s", step, ckpt_dir, group_id,
                 offsets)
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:  # one pruner per node: folders may be node-local
        prune(ckpt_dir, keep)
    return data


def prune(ckpt_dir: Path, keep: int) -> list[str]:
    """Remove all but the ``keep`` newest checkpoints, never the one ``latest`` names. Called after a
    save is complete on every rank, so a kill in between leaves one more checkpoint, never fewer."""
    latest = (ckpt_dir / "latest").read_text().strip() if has_checkpoint(ckpt_dir) else None
    tags = sorted(d.name for d in ckpt_dir.iterdir() if d.is_dir() and TAG.fullmatch(d.name))
    gone = [t for t in tags[:-keep] if t != latest]
    for tag in gone:
        shutil.rmtree(ckpt_dir / tag, ignore_errors=True)  # another node's pruner may share the folder
    if gone:
        log.info("removed old checkpoints %s from %s (keep_checkpoints = %d)", gone, ckpt_dir, keep)
    return gone


def has_checkpoint(ckpt_dir: Path) -> bool:
    return (ckpt_dir / "latest").is_file()


def load(engine: Any, ckpt_dir: Path, expect_manifest: str | None = None) -> dict[str, Any]:
    """Load the latest checkpoint; the optimizer too where DeepSpeed can (else say so and go on).
    A checkpoint written for another publication of the topic (``expect_manifest``) is refused."""
    try:
        path, client = engine.load_checkpoint(str(ckpt_dir))
    except Exception as e:  # noqa: BLE001 - a ZeRO-partitioned optimizer saved at another world size
        log.warning("optimizer state could not be restored (%s): restoring model weights only, the optimizer "
                    "starts fresh", e)
        path, client = engine.load_checkpoint(str(ckpt_dir), load_optimizer_states=False,
                                              load_lr_scheduler_states=True)
    if path is None:
        raise RuntimeError(f"no loadable checkpoint in {ckpt_dir}")
    found = client.get("manifest")
    if expect_manifest is not None and found is not None and found != expect_manifest:
        from stoker.exceptions import StokerError

        raise StokerError(
            f"checkpoint {path} was written for publication {found!r} of the topic, but the manifest is now "
            f"{expect_manifest!r}: the topic was re-published since and its old offsets mean nothing in the new "
            f"data. Remove {ckpt_dir} to train the new publication from scratch (tokenize_publish does this "
            "itself when it re-publishes a topic).")
    saved_world = client["data"]["assignment"]["world"]
    if saved_world != engine.world_size:
        log.warning("resuming a world-size-%d checkpoint at world size %d: partitions reassigned, each keeps "
                    "its offset", saved_world, engine.world_size)
    log.info("resumed from %s at step %d", path, client["step"])
    return client

