"""The Kafka token source: a Stateful reader of one run's topic for one training rank.

* Rank r of world w reads partitions ``manifest_partitions[r::w]`` by manual assignment (no group
  rebalancing: a rebalance would move partitions under a running step).
* read_committed: aborted publish attempts are invisible; reading stops at the manifest's end offsets.
* ``state_dict()`` = the next offset of *every* partition of the run (this rank's, merged by the
  trainer with the other ranks' before a checkpoint), so a resume at another world size simply
  reassigns partitions and carries each partition's offset.
* Offsets advance only when the trainer calls ``mark_trained(batch)`` after the step that consumed it:
  a batch that was read but not trained on is read again after a restart.
* Nothing is skipped silently: ``auto.offset.reset=error``, so an offset that retention deleted
  before it was read is a :class:`DataLost` naming the partition and offsets (librdkafka's default
  would jump to the end and report lag 0), and the sequences read per partition are counted in the
  state, so the trainer checks them against the manifest at the end (:func:`verify_consumed`).
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stoker.exceptions import StokerError
from stoker.run import records
from stoker.run.manifest import Manifest
from training.data.batch import Batch, make_batch

log = logging.getLogger("stoker.train.source")

BUFFER_BYTES = 64 << 20
"""Record bytes buffered per partition before its fetching pauses (the order rule may be waiting on
another partition). Generous on purpose: a paused partition's resume costs a fetch round trip, and a
cap below one fetch response (``max.partition.fetch.bytes``) halved the source's speed."""


class DataLost(StokerError):
    """Sequences of the manifest cannot be trained: deleted before they were read, or missing. A
    relaunch cannot bring them back (the night must not join its line)."""


@dataclass(slots=True)
class Pending:
    batch: Batch
    next_offsets: dict[int, int]
    counts: dict[int, int]
    """Rows of the batch per partition."""


def verify_consumed(state: Mapping[str, Any], manifest: Manifest) -> None:
    """Every partition's read count equals the manifest's, and its next offset is the manifest's end
    (``state``: the run's merged data state at the end of training)."""
    consumed, nxt = state["consumed"], state["next_offsets"]  # checkpoint format 2 always counts
    wrong = [f"partition {p.partition}: read {consumed.get(str(p.partition), 0)} of {p.sequences} sequences in "
             f"offsets [{p.start_offset}, {p.end_offset}), next offset {nxt.get(str(p.partition))}"
             for p in manifest.partitions
             if consumed.get(str(p.partition), 0) != p.sequences or nxt.get(str(p.partition)) != p.end_offset]
    replayed = state.get("replayed", {})  # train.replay: each drawn row of earlier nights once
    wrong += [f"partition {p}: replayed {replayed.get(p, 0)} of its {n} rows of earlier nights"
              for p, n in state.get("replay_total", {}).items() if replayed.get(p, 0) != n]
    if wrong:
        raise DataLost(f"{manifest.topic}: the trained sequences differ from the manifest's: {'; '.join(wrong)}. "
                       "Records were deleted (retention.ms) or skipped before training read them: the night "
                       "cannot be trained exactly and does not join its line; re-publish the date")


def assign(partitions: list[int], rank: int, world: int) -> list[int]:
    """Round-robin: rank r takes every w-th partition. Warns when the split is uneven."""
    if len(partitions) % world:
        log.warning("%d partitions over %d ranks: some ranks read more than others (partitions should be "
                    "a multiple of the world size)", len(partitions), world)
    return sorted(partitions)[rank::world]


class KafkaTokenSource:
    def __init__(self, *, kafka_config: Mapping[str, Any], manifest: Manifest, rank: int, world: int,
                 batch_size: int, group_id: str, poll_timeout: float = 1.0, stall_timeout: float = 120.0) -> None:
        self.manifest = manifest
        self.rank, self.world = rank, world
        self.batch_size = batch_size
        self.group_id = group_id
        self.kafka_config = dict(kafka_config)
        self.poll_timeout, self.stall_timeout = poll_timeout, stall_timeout
        self.end = {p.partition: p.end_offset for p in manifest.partitions}
        self.offsets = {p.partition: p.start_offset for p in manifest.partitions}
        self.start = dict(self.offsets)
        self.consumed: dict[int, int] = {p.partition: 0 for p in manifest.partitions}
        """Sequences read (and marked trained) per partition since its start offset."""
        self.buffer_cap = max(2048, BUFFER_BYTES // ((manifest.seq_len + 1) * records.DTYPES[manifest.dtype].itemsize))
        self.partitions = assign(list(self.end), rank, world)
        self._consumer: Any = None
        self._pos: dict[int, int] = {}
        self._live: set[int] = set()
        """Partitions not yet at their end offset (records may still be buffered for a finished one)."""
        self._buf: dict[int, deque[Any]] = {}
        self._paused: set[int] = set()
        self._order: list[tuple[int, int]] = []
        """Heap of (offsets advanced from the start, partition) of the unfinished partitions."""
        self.wait_seconds = 0.0
        """Time spent blocked on Kafka (the data-wait share of step time)."""

    # -- Stateful ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state = {"topic": self.manifest.topic, "next_offsets": {str(p): o for p, o in self.offsets.items()},
                 "assignment": {"rank": self.rank, "world": self.world, "partitions": self.partitions},
                 "consumed": {str(p): n for p, n in self.consumed.items()}}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("topic") != self.manifest.topic:
            raise StokerError(f"checkpoint data state is for topic {state.get('topic')!r}, this run reads "
                              f"{self.manifest.topic!r}: start from a fresh checkpoint folder")
        for p, o in state["next_offsets"].items():
            p = int(p)
            if p not in self.end or not 0 <= o <= self.end[p]:
                raise StokerError(f"checkpoint offset {o} for partition {p} is outside the run [0, {self.end.get(p)}]")
            self.offsets[p] = int(o)
        self.consumed = {int(p): int(n) for p, n in state["consumed"].items()}
        self._close()

    # -- reading -------------------------------------------------------------------------------
    def remaining(self) -> int:
        """Offsets left in this rank's partitions (an upper bound of the sequences left)."""
        return sum(self.end[p] - self.offsets[p] for p in self.partitions)

    def _open(self) -> None:
        from confluent_kafka import TopicPartition

        from stoker.kafka.clients import Role, consumer

        self._consumer = consumer(self.kafka_config, Role.TRAINER, self.group_id)
        self._pos = {p: self.offsets[p] for p in self.partitions}
        self._live = {p for p in self.partitions if self.offsets[p] < self.end[p]}
        self._buf = {p: deque() for p in self.partitions}
        self._paused = set()
        self._order = [(self._pos[p] - self.start[p], p) for p in sorted(self._live)]
        heapq.heapify(self._order)
        self._consumer.assign([TopicPartition(self.manifest.topic, p, self.offsets[p]) for p in sorted(self._live)])

    def _close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
        self._consumer = None

    def close(self) -> None:
        self._close()

    def _receive(self, msgs: list[Any]) -> None:
        """File fetched messages into their partition's buffer (records past a partition's end too:
        :meth:`next_batch` stops there); note partitions that reached their end. One call per record
        on the hot path, so the range check waits for the record's turn."""
        from confluent_kafka import KafkaError, TopicPartition

        buf = self._buf
        for msg in msgs:
            err = msg.error()
            if err is None:
                buf[msg.partition()].append(msg)
            elif err.code() == KafkaError._AUTO_OFFSET_RESET:
                self._lost(msg.partition(), err)
            elif err.code() != KafkaError._PARTITION_EOF:
                raise StokerError(f"reading {self.manifest.topic}[{msg.partition()}]: {err}")
            elif msg.offset() >= self.end[msg.partition()]:  # only transaction markers lay before here
                self._live.discard(msg.partition())
        full = [p for p in self.partitions if len(buf[p]) >= self.buffer_cap and p not in self._paused]
        if full:
            self._consumer.pause([TopicPartition(self.manifest.topic, p) for p in full])
            self._paused.update(full)

    def _lost(self, p: int, err: Any) -> None:
        from stoker.kafka import offsets as koffsets

        try:
            earliest = koffsets.start_offsets(self.kafka_config, self.manifest.topic).get(p)
        except Exception:  # noqa: BLE001 - the error below is the news; the earliest offset only helps
            earliest = None
        raise DataLost(f"{self.manifest.topic} partition {p}: offset {self._pos[p]} is no longer in the topic (its "
                       f"earliest offset is now {earliest}; the manifest's range is [{self.start[p]}, {self.end[p]})): "
                       f"retention deleted records before training read them ({err}). The night cannot be trained "
                       "exactly and does not join its line: raise the topic's retention.ms and re-publish the date")

    def _fill(self, p: int) -> None:
        """Fetch until partition ``p`` has a record buffered or is at its end (buffering the others')."""
        from confluent_kafka import TopicPartition

        if p in self._paused and len(self._buf[p]) < self.buffer_cap // 2:
            self._consumer.resume([TopicPartition(self.manifest.topic, p)])
            self._paused.discard(p)
        last_progress = time.monotonic()
        while not self._buf[p] and p in self._live:
            msgs = self._consumer.consume(512, 0)  # what has arrived, without waiting for a full batch
            if not msgs:
                one = self._consumer.poll(self.poll_timeout)
                msgs = [one] if one is not None else []
            if msgs:
                last_progress = time.monotonic()
                self._receive(msgs)
            elif time.monotonic() - last_progress > self.stall_timeout:
                raise StokerError(f"no data from {self.manifest.topic} partition {p} for {self.stall_timeout:.0f}s "
                                  "before its end offset: is the broker up?")

    def _finish(self, p: int) -> None:
        """Partition ``p`` (the order's head) is at its end: it leaves the order and stops fetching."""
        from confluent_kafka import TopicPartition

        heapq.heappop(self._order)
        self._pos[p] = self.end[p]
        self._live.discard(p)
        self._buf[p] = deque(maxlen=0)  # drops what is still in flight for it
        if p not in self._paused:
            self._consumer.pause([TopicPartition(self.manifest.topic, p)])
            self._paused.add(p)

    def next_batch(self, limit: int | None = None) -> Pending | None:
        """Up to ``batch_size`` (or ``limit``) sequences from this rank's partitions (fewer at the very end, None
        when every partition is at its end). Offsets are not advanced until :meth:`mark_trained`.

        The order is a function of the offsets alone: each row comes from the rank's unfinished partition
        that has advanced least from its start offset (ties: the lower partition). So for a manifest and a
        world size every rank trains the same sequences in the same batches whatever the arrival timing,
        and a resume from a checkpoint (which holds exactly these offsets) continues the batches an
        uninterrupted run would have trained. At another world size the partitions are reassigned: each
        continues at its offset, and the same rule orders the new assignment, so the batches differ."""
        if self._consumer is None:
            self._open()
        seqs: list[Any] = []
        keys: list[bytes] = []
        counts: dict[int, int] = {}
        t0 = time.perf_counter()
        order, buf, pos, start, end = self._order, self._buf, self._pos, self.start, self.end
        seq_len = self.manifest.seq_len
        decode, replace = records.decode, heapq.heapreplace
        want = self.batch_size if limit is None else limit
        while len(seqs) < want and order:
            p = order[0][1]  # the unfinished partition that advanced least (ties: the lower one)
            if not buf[p]:
                self._fill(p)
                if not buf[p]:
                    self._finish(p)
                    continue
            msg = buf[p].popleft()
            at = msg.offset()
            if at >= end[p]:  # past the manifest's range: not this run's data, the partition is done
                self._finish(p)
                continue
            seqs.append(decode(msg.value(), msg.headers(), seq_len))
            keys.append(msg.key())
            counts[p] = counts.get(p, 0) + 1
            pos[p] = at + 1
            replace(order, (at + 1 - start[p], p))
        for q in self.partitions:
            if q not in self._live and not self._buf[q]:
                self._pos[q] = self.end[q]
        self.wait_seconds += time.perf_counter() - t0
        if not seqs:
            self.offsets.update(self._pos)  # every partition of this rank is at its end
            return None
        return Pending(batch=make_batch(seqs, keys, self.manifest.seq_len), next_offsets=dict(self._pos),
                       counts=counts)

    def take(self, p: int) -> Any:
        """The next record of this rank's partition ``p`` in offset order, whatever the order rule of
        :meth:`next_batch` (a mixture deals rows across topics by its own rule: training/data/mixture_source.py).
        Offsets are not advanced until :meth:`mark_trained`; a partition that ends before the record is
        :class:`DataLost`."""
        if self._consumer is None:
            self._open()
        if not self._buf[p]:
            self._fill(p)
        msg = self._buf[p].popleft() if self._buf[p] else None
        if msg is None or msg.offset() >= self.end[p]:
            raise DataLost(f"{self.manifest.topic} partition {p} ended at offset {self._pos[p]} (its range is "
                           f"[{self.start[p]}, {self.end[p]}), {self.consumed[p]} read of its {self.sequences(p)} "
                           "sequences before this session): records the night was planned to train are missing")
        self._pos[p] = msg.offset() + 1
        return msg

    def sequences(self, p: int) -> int:
        return next(r.sequences for r in self.manifest.partitions if r.partition == p)

    def position(self, p: int) -> int:
        """The offset after the last record :meth:`take` returned from ``p`` (the next one to read)."""
        return self._pos[p] if self._consumer is not None else self.offsets[p]

    def rewind(self, p: int) -> None:
        """Read partition ``p`` again from its start offset (a night that repeats a short corpus)."""
        from confluent_kafka import TopicPartition

        if self._consumer is None:
            self._open()
        tp = TopicPartition(self.manifest.topic, p, self.start[p])
        self._buf[p] = deque()
        self._pos[p] = self.start[p]
        if p in self._paused:
            self._consumer.resume([TopicPartition(self.manifest.topic, p)])
            self._paused.discard(p)
        if p in {a.partition for a in self._consumer.assignment()}:
            self._consumer.seek(tp)
        else:  # it was at its end when this session opened
            self._consumer.incremental_assign([tp])
        self._live.add(p)

    def mark_trained(self, pending: Pending) -> None:
        """The step that consumed ``pending`` is done: its offsets (and read counts) become the source's
        state. In memory only: the trainer's checkpoint saves them, then commits them to Kafka."""
        self.offsets.update(pending.next_offsets)
        for p, n in pending.counts.items():
            self.consumed[p] += n
