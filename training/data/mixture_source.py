"""A night over several corpora: one :class:`training.data.kafka_source.KafkaTokenSource` per component's topic,
dealt into the steps by :class:`stoker.lines.mixture.NightOrder` at the plan's rows (``--mix``, a
:mod:`stoker.lines.mix_plan` file).

* **Steps, not ranks.** Each optimizer step takes the order's next ``micro_batch_size * world * accumulation``
  slots. Every rank computes the whole step (the order is a function of the plan and the dealt counts) and
  trains the slots of the partitions it owns (``manifest_partitions[r::w]`` of every topic, as for one topic),
  split over its micro-steps. So the keys of each optimizer step depend on the plan and that product only:
  resumed at another world size with the same product (more accumulation, or a larger micro-batch), a night
  trains the same keys per step as one never interrupted. A rank that owns none of a micro-step's slots joins it
  with an empty batch (the trainer's rule for a rank out of data).
* **Offsets for every topic** are in the checkpoint's data slot, one sub-state per component in the form of a
  single topic's, with the dealt counts (the order's whole state) and the accounting; each topic's offsets are
  committed to the training group after a checkpoint.
* **Exactly the plan.** A component read past its last record in a pass starts it over (``when_short:
  repeat``); every record taken is checked against the slot the order names (its index in the pass), and at the
  end each partition's read count must equal :func:`stoker.lines.mixture.partition_rows` of the plan (else
  :class:`DataLost`). Rows a ``shrink`` night leaves stay in their topics, named in the plan and the summary.
* **Accounting.** The trainer all-reduces each micro-step's rows and label tokens per component
  (:meth:`local_counts`, :meth:`account`), so every rank holds the same realised shares per window of
  ``mix.window_steps`` optimizer steps; they are saved with the offsets and end in ``summary.json``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stoker.exceptions import StokerError
from stoker.lines.mix_plan import MixPlan
from stoker.lines.mixture import NightOrder, Slot, partition_rows, rank_chunks
from stoker.run import records
from stoker.run.manifest import Manifest
from training.data.batch import IGNORE, Batch, make_batch
from training.data.kafka_source import DataLost, KafkaTokenSource

log = logging.getLogger("stoker.train.mixture")


@dataclass(slots=True)
class MixPending:
    batch: Batch
    taken: dict[str, dict[int, int]]
    """Records of the batch per component and partition."""
    positions: dict[str, dict[int, int]]
    """Each touched partition's next offset once the batch is trained."""
    rows: list[int]
    tokens: list[int]
    """Rows and label tokens of the batch per component (in :attr:`MixtureSource.names` order)."""


class MixtureSource:
    """The trainer's data source for a ``--mix`` night; the interface of a single topic's source."""

    def __init__(self, *, kafka_config: Mapping[str, Any], plan: MixPlan, manifests: Mapping[str, Manifest],
                 rank: int, world: int, micro_batch_size: int, accumulation: int, group_id: str,
                 poll_timeout: float = 1.0, stall_timeout: float = 120.0) -> None:
        self.plan, self.names = plan, sorted(manifests)
        self.rank, self.world, self.accumulation = rank, world, accumulation
        self.readers = {k: KafkaTokenSource(kafka_config=kafka_config, manifest=manifests[k], rank=rank, world=world,
                                            batch_size=micro_batch_size, group_id=group_id,
                                            poll_timeout=poll_timeout, stall_timeout=stall_timeout)
                        for k in self.names}
        self.seq_len = manifests[self.names[0]].seq_len
        self.sequences = {k: {p.partition: p.sequences for p in m.partitions} for k, m in manifests.items()}
        self.step_rows = micro_batch_size * world * accumulation
        self.order = NightOrder(plan.night.rows, self.sequences, plan.mix.stratified)
        self.owned = {k: set(r.partitions) for k, r in self.readers.items()}
        self.steps = 0
        """Optimizer steps dealt so far (the accounting's window of a micro-step is ``(steps - 1) // window``)."""
        self.tally: list[dict[str, list[int]]] = []
        """Per window of ``mix.window_steps`` optimizer steps: component → [rows, label tokens], all ranks."""
        self._read = {k: dict(r.consumed) for k, r in self.readers.items()}
        self._chunks: list[list[Slot]] = []
        self._micro = 0
        self._wait = 0.0
        self._index = {k: i for i, k in enumerate(self.names)}
        self._prefix = {k: r.manifest.topic.encode() + b":" for k, r in self.readers.items()}
        """The keys audit's name of a row: ``<topic>:<key>`` (keys are unique within a topic only)."""

    # -- what the trainer asks of any source ---------------------------------------------------
    @property
    def partitions(self) -> dict[str, list[int]]:
        return {k: list(r.partitions) for k, r in self.readers.items()}

    @property
    def wait_seconds(self) -> float:
        return self._wait

    def remaining(self) -> int:
        """Rows of the night not yet dealt (all ranks)."""
        return self.order.left

    def close(self) -> None:
        for r in self.readers.values():
            r.close()

    def state_dict(self) -> dict[str, Any]:
        return {"mixture": {"dealt": self.order.state_dict(), "steps": self.steps, "tally": self.tally,
                            "step_rows": self.step_rows, "rows": dict(self.plan.night.rows)},
                "components": {k: r.state_dict() for k, r in self.readers.items()},
                "assignment": {"rank": self.rank, "world": self.world, "partitions": []}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        mix = state.get("mixture")
        if mix is None or mix.get("rows") != dict(self.plan.night.rows) or sorted(state["components"]) != self.names:
            raise StokerError(f"the checkpoint's data state is not this mixture night's ({self.plan.night.rows} over "
                              f"{self.names}; it holds {mix and mix.get('rows')}): the mix plan changed after the "
                              "night began training; restore it, or remove the trainer folder's checkpoints")
        for k, r in self.readers.items():
            r.load_state_dict(state["components"][k])
        self.order = NightOrder(self.plan.night.rows, self.sequences, self.plan.mix.stratified, mix["dealt"])
        self.steps, self.tally = int(mix["steps"]), [dict(w) for w in mix["tally"]]
        self._read = {k: dict(r.consumed) for k, r in self.readers.items()}
        self._chunks, self._micro = [], 0
        if mix["step_rows"] != self.step_rows:
            log.warning("the night was dealt %d rows a step and now %d (micro-batch x world x accumulation changed): "
                        "its order continues, cut into other steps", mix["step_rows"], self.step_rows)

    # -- reading -------------------------------------------------------------------------------
    def _deal_step(self) -> None:
        slots = self.order.step(self.step_rows)
        self._chunks = rank_chunks(slots, self.owned, self.accumulation)
        if slots:
            self.steps += 1

    def next_batch(self) -> MixPending | None:
        """This rank's rows of the step's next micro-step (None: it owns none of them, or the night is dealt)."""
        t0 = time.perf_counter()
        if self._micro == 0:
            self._deal_step()
        chunk = self._chunks[self._micro] if self._micro < len(self._chunks) else []
        self._micro = (self._micro + 1) % self.accumulation
        if not chunk:
            self._wait += time.perf_counter() - t0
            return None
        seqs, keys = [], []
        taken: dict[str, dict[int, int]] = {}
        for s in chunk:
            msg = self._take(s)
            seqs.append(records.decode(msg.value(), msg.headers(), self.seq_len))
            keys.append(self._prefix[s.component] + msg.key())
            part = taken.setdefault(s.component, {})
            part[s.partition] = part.get(s.partition, 0) + 1
        batch = make_batch(seqs, keys, self.seq_len)
        row_tokens = (batch.labels != IGNORE).sum(axis=1)
        rows, tokens = [0] * len(self.names), [0] * len(self.names)
        for s, t in zip(chunk, row_tokens, strict=True):
            i = self._index[s.component]
            rows[i] += 1
            tokens[i] += int(t)
        positions = {k: {p: self.readers[k].position(p) for p in ps} for k, ps in taken.items()}
        self._wait += time.perf_counter() - t0
        return MixPending(batch=batch, taken=taken, positions=positions, rows=rows, tokens=tokens)

    def _take(self, s: Slot) -> Any:
        reader, read = self.readers[s.component], self._read[s.component]
        want = s.use * self.sequences[s.component][s.partition] + s.index
        if read[s.partition] != want:
            raise StokerError(f"{reader.manifest.topic} partition {s.partition}: the mixture's order names its record "
                              f"{want} (pass {s.use}, index {s.index}) but this rank has read {read[s.partition]}: "
                              "the checkpoint's offsets and its dealt counts disagree")
        if s.index == 0 and s.use > 0:  # the component's next pass (when_short: repeat)
            reader.rewind(s.partition)
        read[s.partition] += 1
        return reader.take(s.partition)

    def mark_trained(self, pending: MixPending) -> None:
        for k, parts in pending.taken.items():
            reader = self.readers[k]
            reader.offsets.update(pending.positions[k])
            for p, n in parts.items():
                reader.consumed[p] += n

    # -- accounting ----------------------------------------------------------------------------
    def local_counts(self, pending: MixPending | None) -> list[int]:
        """This rank's rows then label tokens per component in the micro-step (zeros when it has none)."""
        n = len(self.names)
        return [0] * 2 * n if pending is None else [*pending.rows, *pending.tokens]

    def account(self, counts: list[float]) -> None:
        """A micro-step's rows and tokens per component, summed over every rank (the same on each)."""
        n = len(self.names)
        window = max(self.steps - 1, 0) // self.plan.mix.window_steps
        while len(self.tally) <= window:
            self.tally.append({})
        for i, k in enumerate(self.names):
            if counts[i] or counts[n + i]:
                rows, tokens = self.tally[window].get(k, [0, 0])
                self.tally[window][k] = [rows + int(counts[i]), tokens + int(counts[n + i])]

    def verify(self, state: Mapping[str, Any]) -> None:
        """At the night's end: each partition of each component gave exactly the plan's rows."""
        wrong = []
        for k in self.names:
            want = partition_rows(self.sequences[k], self.plan.night.rows[k])
            got = state["components"][k]["consumed"]
            wrong += [f"{k} ({self.readers[k].manifest.topic}) partition {p}: trained {got.get(str(p), 0)} of its "
                      f"planned {n}" for p, n in want.items() if got.get(str(p), 0) != n]
        if wrong:
            raise DataLost(f"the mixture night trained other rows than its plan: {'; '.join(wrong)}. Records were "
                           "deleted or skipped before training read them: the night does not join its line")

    def summary(self) -> dict[str, Any]:
        """The realised mixture: per component rows and tokens for the night and per window, beside the targets."""
        night = self.plan.night
        totals: dict[str, list[int]] = {k: [0, 0] for k in self.names}
        for w in self.tally:
            for k, (rows, tokens) in w.items():
                totals[k][0] += rows
                totals[k][1] += tokens
        step = self.plan.mix.window_steps
        return {"targets": dict(self.plan.mix.shares), "when_short": self.plan.mix.when_short,
                "stratified": self.plan.mix.stratified, "planned_rows": dict(night.rows),
                "available": dict(night.available), "left": dict(night.left), "repeated": dict(night.repeated),
                "binding": night.binding, "missing": dict(self.plan.missing),
                "topics": {k: r.manifest.topic for k, r in self.readers.items()},
                "realised": _shares(totals), "window_steps": step,
                "windows": [{"steps": [i * step + 1, min((i + 1) * step, self.steps)], **_shares(w)}
                            for i, w in enumerate(self.tally)]}


def _shares(counts: Mapping[str, list[int]]) -> dict[str, Any]:
    rows, tokens = sum(c[0] for c in counts.values()), sum(c[1] for c in counts.values())
    return {"rows": {k: c[0] for k, c in counts.items()}, "tokens": {k: c[1] for k, c in counts.items()},
            "token_shares": {k: c[1] / tokens if tokens else 0.0 for k, c in counts.items()},
            "row_shares": {k: c[0] / rows if rows else 0.0 for k, c in counts.items()}}
