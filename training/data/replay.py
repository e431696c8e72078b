"""Replayed rows mixed into a night's batches (``train.replay``; the draw is :mod:`stoker.lines.replay`'s).

The rows drawn from earlier nights (``replay/`` in the trainer's folder, memory-mapped: each rank reads only the
pages of the rows it trains) are dealt to the partitions of the night's topic (row ``j`` to the ``j mod P``-th),
so they move with their partition when a resume changes the world size, and each partition's count of
replayed rows is in the checkpoint beside its offset (``replayed``).

A rank spreads its replayed rows evenly over its rows: after ``k`` rows it has replayed ``k * R // (F + R)``
(``F``: its partitions' own sequences, ``R``: their replay rows), each from the partition that replayed least
(ties: the lower one); when its own sequences end, the rest follow. Every count comes from the checkpointed
state, so a resume continues the batches an uninterrupted run would have trained, and at the end every
replayed row was trained once (checked with the offsets, :func:`training.data.kafka_source.verify_consumed`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stoker.exceptions import StokerError
from stoker.lines.replay_rows import ReplayRows, rows_present
from training.data.batch import Batch, concat, make_batch


def load_rows(path: Path) -> ReplayRows | None:
    return ReplayRows(path) if rows_present(path) else None


@dataclass(slots=True)
class Mixed:
    batch: Batch
    fresh: Any
    """The night's own rows (the source's pending batch), None when the batch is all replay."""
    replayed: dict[int, int]
    """Replayed rows of the batch per partition."""


class ReplayMixer:
    """A :class:`training.data.kafka_source.KafkaTokenSource` with replayed rows mixed in; the same interface."""

    def __init__(self, source: Any, rows: ReplayRows) -> None:
        self.source, self.rows = source, rows
        parts = sorted(source.end)
        self.slots = {p: list(range(k, len(rows), len(parts))) for k, p in enumerate(parts)}
        self.replayed = dict.fromkeys(parts, 0)
        self.own = {p.partition: p.sequences for p in source.manifest.partitions}

    @property
    def partitions(self) -> list[int]:
        return list(self.source.partitions)

    @property
    def offsets(self) -> dict[int, int]:
        return dict(self.source.offsets)

    @property
    def wait_seconds(self) -> float:
        return float(self.source.wait_seconds)

    def close(self) -> None:
        self.source.close()

    def remaining(self) -> int:
        return int(self.source.remaining()) + sum(len(self.slots[p]) - self.replayed[p] for p in self.partitions)

    def state_dict(self) -> dict[str, Any]:
        return {**self.source.state_dict(), "replayed": {str(p): n for p, n in self.replayed.items()},
                "replay_total": {str(p): len(s) for p, s in self.slots.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        total = {str(p): len(s) for p, s in self.slots.items()}
        if state.get("replay_total") != total or state.get("consumed") is None:
            raise StokerError(f"the checkpoint's replay state {state.get('replay_total')} is not this night's draw "
                              f"{total} ({self.rows.path}): train.replay or the draw changed after the night began "
                              "training; restore them, or remove the trainer folder's checkpoints to train the "
                              "night again from its parent")
        self.source.load_state_dict(state)
        self.replayed = {int(p): int(n) for p, n in state["replayed"].items()}

    def _picks(self, n: int) -> tuple[list[int], dict[int, int]]:
        items: list[int] = []
        picks: dict[int, int] = {}
        for _ in range(n):
            p = min((q for q in self.partitions if self.replayed[q] + picks.get(q, 0) < len(self.slots[q])),
                    key=lambda q: (self.replayed[q] + picks.get(q, 0), q))
            items.append(self.slots[p][self.replayed[p] + picks.get(p, 0)])
            picks[p] = picks.get(p, 0) + 1
        return items, picks

    def next_batch(self) -> Mixed | None:
        mine, src = self.partitions, self.source
        own, rep = sum(self.own[p] for p in mine), sum(len(self.slots[p]) for p in mine)
        own_done, rep_done = sum(src.consumed[p] for p in mine), sum(self.replayed[p] for p in mine)
        size = src.batch_size
        due = (own_done + rep_done + size) * rep // (own + rep) if own + rep else 0
        n = max(0, min(rep - rep_done, due - rep_done))
        fresh = src.next_batch(limit=size - n) if size - n > 0 else None
        got = len(fresh.batch.keys) if fresh is not None else 0
        if got < size - n:  # the night's own rows ran out: the replayed rest follows
            n = min(rep - rep_done, size - got)
        items, picks = self._picks(n)
        if not items:
            return None if fresh is None else Mixed(batch=fresh.batch, fresh=fresh, replayed={})
        replay = make_batch([self.rows.sequence(i) for i in items], [self.rows.key(i) for i in items],
                            src.manifest.seq_len)
        return Mixed(batch=concat(fresh.batch, replay) if fresh is not None else replay, fresh=fresh,
                     replayed=picks)

    def mark_trained(self, pending: Mixed) -> None:
        if pending.fresh is not None:
            self.source.mark_trained(pending.fresh)
        for p, n in pending.replayed.items():
            self.replayed[p] += n


def with_replay(source: Any, rows: ReplayRows | None) -> Any:
    return ReplayMixer(source, rows) if rows is not None and len(rows) else source
