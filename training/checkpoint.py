"""Checkpoints that hold the data state: model, optimizer and scheduler (DeepSpeed's own) plus one
named slot per other stateful part of the trainer (as torchtitan's checkpointer keeps ``dataloader``
and ``train_state``): ``data``, every rank's Kafka offsets; ``progress``, the run's counters. Then
the offsets are committed to the training consumer group so the lag sensor sees progress.

DeepSpeed saves only rank 0's ``client_state``, so the ranks' source states are gathered first.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
from pathlib import Path
from typing import Any

from stoker.exceptions import StokerError
from stoker.files import atomic_write_json
from stoker.kafka import offsets as koffsets
from stoker.layout import CHECKPOINT_COMPLETE, CHECKPOINT_TAG, FORK_FILE, checkpoint_tag, complete_checkpoints

log = logging.getLogger("stoker.train.checkpoint")


def merge_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """One data state for the run: each partition's offset (read count, replayed rows) from the rank that owns it;
    a mixture's (``components``) merged component by component, the rest (its order, its accounting) the same on
    every rank."""
    if "components" in states[0]:
        merged = dict(states[0])
        merged["components"] = {k: merge_states([s["components"][k] for s in states]) for k in states[0]["components"]}
        merged["assignment"] = {"world": states[0]["assignment"]["world"]}
        return merged
    merged = dict(states[0])
    for key in ("next_offsets", "consumed", "replayed"):
        if any(key not in s for s in states):
            merged.pop(key, None)
            continue
        values = dict(states[0][key])
        for s in states:
            for p in s["assignment"]["partitions"]:
                values[str(p)] = s[key][str(p)]
        merged[key] = values
    merged["assignment"] = {"world": states[0]["assignment"]["world"],
                            "ranks": [s["assignment"]["partitions"] for s in states]}
    return merged


def topic_offsets(state: dict[str, Any]) -> dict[str, dict[int, int]]:
    """Topic → partition → next offset of a merged data state (every component's, for a mixture)."""
    parts = state["components"].values() if "components" in state else [state]
    return {s["topic"]: {int(p): o for p, o in s["next_offsets"].items()} for s in parts}


def all_offsets(state: dict[str, Any]) -> dict[str, int]:
    """``topic[partition]`` → next offset of a merged data state."""
    return {f"{t}[{p}]": o for t, offsets in topic_offsets(state).items() for p, o in offsets.items()}


def owned_offsets(state: dict[str, Any]) -> dict[str, int]:
    """``topic[partition]`` → next offset of the partitions one rank's (unmerged) data state owns."""
    parts = state["components"].values() if "components" in state else [state]
    return {f"{s['topic']}[{p}]": s["next_offsets"][str(p)] for s in parts for p in s["assignment"]["partitions"]}


SLOTS = ("data", "progress")
"""The named slots of a checkpoint's client state; each is the ``state_dict()`` of one stateful part."""
_SLOTS_KEY = "stoker_slots"
CHECKPOINT_VERSION = 2
"""The format of Stoker's part of a checkpoint (its ``client_state``): 2 is named slots with read counts. A
resume refuses any other, naming both versions, as a run plan of another version is refused."""
_VERSION_KEY = "stoker_version"


KILL_IN_SAVE_ENV = "STOKER_FAULT_KILL_IN_SAVE"
"""Testing only: the step at which rank 0 is killed (SIGKILL) inside DeepSpeed's ``save_checkpoint``, once its
first file is on disk and before the rest (tests/integration/test_train_shapes.py); unset, nothing happens."""


def _kill_inside_save_if_asked(engine: Any, step: int) -> None:
    import torch.distributed as dist

    if os.environ.get(KILL_IN_SAVE_ENV) != str(step) or dist.get_rank() != 0:
        return
    writer = engine.checkpoint_engine
    first = writer.save

    def save_then_die(state_dict: Any, path: str) -> None:
        first(state_dict, path)
        log.warning("%s=%d: killing rank 0 inside save_checkpoint, after %s", KILL_IN_SAVE_ENV, step, path)
        os.kill(os.getpid(), signal.SIGKILL)

    writer.save = save_then_die


def save(engine: Any, step: int, ckpt_dir: Path, *, slots: dict[str, dict[str, Any]],
         kafka_config: dict[str, Any] | None, group_id: str, keep: int) -> dict[str, Any]:
    """Save DeepSpeed's state and ``slots`` (``data``: the ranks' merged data state, the same on every
    rank) as tag ``step``; returns the data slot."""
    import torch.distributed as dist

    missing = [name for name in SLOTS if name not in slots]
    if missing:
        raise ValueError(f"checkpoint slots {missing} missing: a checkpoint holds every one of {list(SLOTS)}")
    data = slots["data"]
    tag, node_leader = checkpoint_tag(step), int(os.environ.get("LOCAL_RANK", "0")) == 0
    if node_leader:  # a killed life's half-saved tag of this step: never written through, never mixed in
        shutil.rmtree(ckpt_dir / tag, ignore_errors=True)
    dist.barrier()
    client = {_SLOTS_KEY: dict(slots), _VERSION_KEY: CHECKPOINT_VERSION, "step": step}
    _kill_inside_save_if_asked(engine, step)
    engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state=client)
    dist.barrier()  # every rank's shards are on disk: only now is the tag complete
    if node_leader:  # each node's leader (nodes may share the folder: a temporary file of its own each)
        atomic_write_json(ckpt_dir / tag / CHECKPOINT_COMPLETE, {"step": step, "world": dist.get_world_size()})
    dist.barrier()
    if dist.get_rank() == 0 and kafka_config is not None:
        for topic, offsets in topic_offsets(data).items():
            koffsets.commit_offsets(kafka_config, group_id, topic, offsets)
            log.info("checkpoint step %d saved in %s; offsets committed for group %s: %s %s", step, ckpt_dir,
                     group_id, topic, offsets)
    if node_leader:  # one pruner per node: folders may be node-local
        prune(ckpt_dir, keep)
    return data


def prune(ckpt_dir: Path, keep: int) -> list[str]:
    """Keep the ``keep`` newest complete checkpoints; remove every other tag, complete or not (a killed
    life's half-saved tags included). Called after a save is complete on every rank, so a kill in
    between leaves one more checkpoint, never fewer."""
    kept = set(complete_checkpoints(ckpt_dir)[-keep:])
    fork = ckpt_dir / FORK_FILE  # wsd: the state before the cooldown, which the line keeps
    if kept and fork.is_file():
        kept.add(json.loads(fork.read_text())["tag"])
    tags = sorted(d.name for d in ckpt_dir.iterdir() if d.is_dir() and CHECKPOINT_TAG.fullmatch(d.name))
    gone = [t for t in tags if t not in kept] if kept else []
    for tag in gone:
        shutil.rmtree(ckpt_dir / tag, ignore_errors=True)  # another node's pruner may share the folder
    if gone:
        log.info("removed old checkpoints %s from %s (keep_checkpoints = %d)", gone, ckpt_dir, keep)
    return gone


def has_checkpoint(ckpt_dir: Path) -> bool:
    return bool(complete_checkpoints(ckpt_dir))


def load(engine: Any, ckpt_dir: Path, expect_manifest: str | None = None) -> dict[str, dict[str, Any]]:
    """Load the newest complete checkpoint with its optimizer state; returns its named slots. Only
    where DeepSpeed cannot load a ZeRO-partitioned optimizer saved at another world size does the
    optimizer start fresh (logged); at the same world size a failure is an error, never a silent
    reset of Adam's moments. A checkpoint written for another publication of the topic
    (``expect_manifest``) is refused."""
    tag = complete_checkpoints(ckpt_dir)[-1]
    saved_world = json.loads((ckpt_dir / tag / CHECKPOINT_COMPLETE).read_text())["world"]
    try:
        path, client = engine.load_checkpoint(str(ckpt_dir), tag=tag)
    except Exception as e:
        if saved_world == engine.world_size:
            raise StokerError(f"checkpoint {ckpt_dir / tag} (complete, world size {saved_world}) does not load: "
                              f"{e}. Remove the tag to resume from the one before it") from e
        log.warning("optimizer state saved at world size %d could not be restored at %d (%s): restoring model "
                    "weights only, the optimizer starts fresh", saved_world, engine.world_size, e)
        path, client = engine.load_checkpoint(str(ckpt_dir), tag=tag, load_optimizer_states=False,
                                              load_lr_scheduler_states=True)
    if path is None:
        raise StokerError(f"checkpoint {ckpt_dir / tag} is marked complete but DeepSpeed found nothing to load")
    slots = client_slots(client, f"{ckpt_dir / tag}")
    found = slots["progress"].get("manifest")
    if expect_manifest is not None and found is not None and found != expect_manifest:
        raise StokerError(
            f"checkpoint {path} was written for publication {found!r} of the topic, but the manifest is now "
            f"{expect_manifest!r}: the topic was re-published since and its old offsets mean nothing in the new "
            f"data. Remove {ckpt_dir} to train the new publication from scratch (tokenize_publish does this "
            "itself when it re-publishes a topic).")
    if saved_world != engine.world_size:
        log.warning("resuming a world-size-%d checkpoint at world size %d: partitions reassigned, each keeps "
                    "its offset", saved_world, engine.world_size)
    log.info("resumed from %s at step %d", path, client["step"])
    return slots


def client_slots(client: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
    """The named slots of a loaded client state, of this format version only (:data:`CHECKPOINT_VERSION`)."""
    if _SLOTS_KEY not in client and "data" not in client:
        raise StokerError(f"checkpoint {where} holds no Stoker state (slots {list(SLOTS)}): it was not written "
                          "by Stoker's trainer; remove it to train the night from its start")
    version = client.get(_VERSION_KEY, 1)  # the flat state before slots, and the first slots, carried none
    if version != CHECKPOINT_VERSION:
        raise StokerError(f"checkpoint {where} is of Stoker's checkpoint format {version}; this trainer reads format "
                          f"{CHECKPOINT_VERSION}: remove the run's checkpoints folder to train the night from its "
                          "start (its topic is still there), or resume it with the Stoker that wrote it")
    slots = dict(client[_SLOTS_KEY])
    missing = [name for name in SLOTS if name not in slots]
    if missing:
        raise StokerError(f"checkpoint {where} lacks slots {missing}: remove the tag to resume from the one before")
    return slots


def restore(slots: dict[str, dict[str, Any]], parts: dict[str, Any]) -> None:
    """Give each stateful part its own slot (``load_state_dict``)."""
    for name, part in parts.items():
        part.load_state_dict(slots[name])

