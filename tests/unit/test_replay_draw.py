"""train.replay's pure logic: which earlier sequences a night draws (stoker/lines/replay.py), and how the trainer's
mixer spreads them over the night's batches and resumes them (training/data/replay.py). The mixer's source
here is a list-backed stand-in with the Kafka source's order rule; the real source, broker and trainer are in
tests/integration/test_replay.py."""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from stoker.exceptions import StokerError
from stoker.lines.replay import draw, replay_count
from stoker.lines.replay_rows import ReplayRows, write_rows
from stoker.run.records import PackedSequence
from training.checkpoint import merge_states
from training.data.batch import make_batch
from training.data.replay import ReplayMixer, with_replay

pytestmark = pytest.mark.unit
SEQ_LEN = 8


def _lineage(*nights: tuple[str, dict[str, list[int]], int]) -> list[dict]:
    return [{"init": "random"}, *({"topic": t, "offsets": o, "sequences": n} for t, o, n in nights)]


def test_a_draw_is_the_share_of_the_night_spread_over_earlier_nights_and_fixed_by_its_seed():
    lineage = _lineage(("n1", {"0": [0, 500], "1": [0, 500]}, 1000), ("n2", {"0": [10, 3010]}, 3000))
    picks = draw(lineage, 950, 0.05, seed="night3")
    assert replay_count(950, 0.05) == 50 and sum(len(o) for p in picks.values() for o in p.values()) == 50
    assert picks == draw(lineage, 950, 0.05, seed="night3") != draw(lineage, 950, 0.05, seed="other")
    for topic, parts in picks.items():  # records by their index in the partition's range
        for p, indices in parts.items():
            start, end = next(e for e in lineage if e.get("topic") == topic)["offsets"][str(p)]
            assert indices == sorted(set(indices)) and all(0 <= k < end - start for k in indices)
    # a night records each partition's count of records (its offsets hold transaction markers too)
    counted = [{**lineage[1], "partition_sequences": {"0": 300, "1": 200}}]
    every = draw(counted, 10_000, 0.2, seed="x")  # all 500 of them, each once
    assert every == {"n1": {0: list(range(300)), 1: list(range(200))}}
    big = draw(lineage, 20_000, 0.2, seed="x")  # 5,000 wanted, 4,000 there: every earlier sequence once
    assert sum(len(o) for o in big["n1"].values()) == 1000 and len(big["n2"][0]) == 3000
    mid = draw(lineage, 8000, 0.2, seed="x")  # 2,000 of 4,000: the nights in proportion to their size
    assert 400 < sum(len(o) for o in mid["n1"].values()) < 600
    assert draw(lineage, 100, 0.0, seed="x") == {} and draw(_lineage(), 100, 0.1, seed="x") == {}


def _seq(token: int) -> PackedSequence:
    return PackedSequence(np.full(SEQ_LEN + 1, token, dtype=np.uint32), "t", np.zeros(1, dtype=np.uint32))


@dataclass
class Pending:
    batch: object
    counts: dict[int, int]


@dataclass
class ListSource:
    """The Kafka source's contract over lists: partition p holds keys b'p<p>-<i>'; rank r of w reads
    partitions r::w, each row from the one that advanced least."""

    sizes: dict[int, int]
    rank: int
    world: int
    batch_size: int = 3
    consumed: dict[int, int] = field(default_factory=dict)
    wait_seconds: float = 0.0

    def __post_init__(self) -> None:
        self.end = dict(self.sizes)
        self.partitions = sorted(self.sizes)[self.rank::self.world]
        self.consumed = self.consumed or dict.fromkeys(self.sizes, 0)
        self.manifest = type("M", (), {"seq_len": SEQ_LEN, "partitions": [
            type("P", (), {"partition": p, "sequences": n})() for p, n in self.sizes.items()]})()

    @property
    def offsets(self) -> dict[int, int]:
        return dict(self.consumed)

    def next_batch(self, limit: int | None = None) -> Pending | None:
        heap = [(self.consumed[p], p) for p in self.partitions if self.consumed[p] < self.sizes[p]]
        heapq.heapify(heap)
        keys, counts = [], Counter()
        while heap and len(keys) < (self.batch_size if limit is None else limit):
            at, p = heapq.heappop(heap)
            keys.append(b"p%d-%d" % (p, at))
            counts[p] += 1
            if at + 1 < self.sizes[p]:
                heapq.heappush(heap, (at + 1, p))
        return Pending(make_batch([_seq(1)] * len(keys), keys, SEQ_LEN), dict(counts)) if keys else None

    def mark_trained(self, pending: Pending) -> None:
        for p, n in pending.counts.items():
            self.consumed[p] += n

    def state_dict(self) -> dict:
        return {"next_offsets": {str(p): n for p, n in self.consumed.items()},
                "consumed": {str(p): n for p, n in self.consumed.items()},
                "assignment": {"rank": self.rank, "world": self.world, "partitions": self.partitions}}

    def load_state_dict(self, state: dict) -> None:
        self.consumed = {int(p): n for p, n in state["consumed"].items()}

    def remaining(self) -> int:
        return sum(self.sizes[p] - self.consumed[p] for p in self.partitions)

    def close(self) -> None:
        pass


def _rows(tmp_path: Path, n: int) -> ReplayRows:
    write_rows(tmp_path / "replay", [(b"replay:old:k%03d" % i, _seq(2)) for i in range(n)], SEQ_LEN)
    return ReplayRows(tmp_path / "replay")


def _run(mixers: list[ReplayMixer], steps: int | None = None) -> list[list[bytes]]:
    """Batches of every rank, step by step (a rank out of rows skips), until all are out or ``steps``."""
    out: list[list[bytes]] = []
    while steps is None or len(out) < steps * len(mixers):
        got = [(m, m.next_batch()) for m in mixers]
        if all(b is None for _, b in got):
            break
        for m, b in got:
            if b is not None:
                m.mark_trained(b)
                out.append(list(b.batch.keys))
    return out


def test_replayed_rows_are_spread_over_the_night_and_every_row_is_trained_once(tmp_path):
    sizes, rows = {0: 20, 1: 17, 2: 11, 3: 9}, _rows(tmp_path, 15)
    mixers = [ReplayMixer(ListSource(sizes, r, 2), rows) for r in range(2)]
    batches = _run(mixers)
    keys = [k for b in batches for k in b]
    assert len(keys) == len(set(keys)) == 57 + 15
    assert sorted(k for k in keys if k.startswith(b"replay:")) == sorted(rows.key(i) for i in range(15))
    for m in mixers:  # each rank's replayed share after every batch is within a batch of its even share
        assert sum(m.replayed[p] for p in m.partitions) == sum(len(m.slots[p]) for p in m.partitions)
    first_half = [k for b in batches[:len(batches) // 2] for k in b]
    assert 4 <= sum(k.startswith(b"replay:") for k in first_half) <= 11  # not all at the start or the end
    state = merge_states([m.state_dict() for m in mixers])
    assert state["replayed"] == state["replay_total"] and sum(state["replayed"].values()) == 15


def test_a_resume_continues_the_uninterrupted_batches_and_another_world_size_trains_each_row_once(tmp_path):
    sizes, rows = {0: 20, 1: 17, 2: 11, 3: 9}, _rows(tmp_path, 15)
    whole = _run([ReplayMixer(ListSource(sizes, r, 2), rows) for r in range(2)])
    mixers = [ReplayMixer(ListSource(sizes, r, 2), rows) for r in range(2)]
    head = _run(mixers, steps=4)
    state = merge_states([m.state_dict() for m in mixers])  # a checkpoint after 4 steps
    resumed = [ReplayMixer(ListSource(sizes, r, 2), rows) for r in range(2)]
    for m in resumed:
        m.load_state_dict(state)
    assert head + _run(resumed) == whole  # the same batches on the same ranks
    one = ReplayMixer(ListSource(sizes, 0, 1), rows)  # the 2-rank checkpoint resumed on 1 rank
    one.load_state_dict(state)
    keys = [k for b in head + _run([one]) for k in b]
    assert len(keys) == len(set(keys)) == 57 + 15
    (tmp_path / "other").mkdir()
    other = ReplayMixer(ListSource(sizes, 0, 1), _rows(tmp_path / "other", 9))  # another draw
    with pytest.raises(StokerError, match="not this night's draw"):
        other.load_state_dict(state)
    assert with_replay("source", None) == "source"


def test_replay_rows_round_trip_through_their_folder_memory_mapped(tmp_path):
    from stoker.run.records import PackedSequence

    seqs = [(b"replay:t:k%d" % i, PackedSequence(np.arange(i, i + SEQ_LEN + 1, dtype=np.uint32), "t",
                                                 np.arange(i % 3 + 1, dtype=np.uint32), None if i % 2 else 5))
            for i in range(7)]
    assert write_rows(tmp_path / "replay", seqs, SEQ_LEN) == 7
    rows = ReplayRows(tmp_path / "replay")
    assert isinstance(rows.tokens, np.memmap) and len(rows) == 7  # mapped, not loaded
    for i, (key, seq) in enumerate(seqs):
        got = rows.sequence(i)
        assert rows.key(i) == key and np.array_equal(got.tokens, seq.tokens) and got.valid == seq.valid
        assert list(got.doc_starts) == list(seq.doc_starts)
    assert write_rows(tmp_path / "replay", [], SEQ_LEN) == 0 and len(ReplayRows(tmp_path / "replay")) == 0
    assert not (tmp_path / "replay.tmp").exists()


def test_a_store_an_earlier_stoker_left_as_npz_is_still_read(tmp_path):
    np.savez(tmp_path / "replay_store.npz", tokens=np.ones((2, SEQ_LEN + 1), np.uint32), valid=np.array([-1, 3]),
             doc_starts=np.zeros(2, np.uint32), doc_bounds=np.array([0, 1, 2]),
             keys=np.array(["replay:a:0", "replay:a:1"]))
    rows = ReplayRows(tmp_path / "replay_store.npz")
    assert [rows.key(i) for i in range(2)] == [b"replay:a:0", b"replay:a:1"] and rows.sequence(1).valid == 3


def test_rows_are_streamed_to_disk_not_held(tmp_path):
    """The writer holds one row and its file buffers: 4,000 rows of 4,097 ids (65 MB) in well under 16 MB."""
    import tracemalloc

    from stoker.lines.replay_rows import RowWriter
    from stoker.run.records import PackedSequence

    tokens = np.zeros(4097, dtype=np.uint32)
    writer = RowWriter(tmp_path / "replay", 4096)
    tracemalloc.start()
    for i in range(4000):
        writer.add(b"replay:t:%08d" % i, PackedSequence(tokens, "t", np.zeros(2, np.uint32), None))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert writer.close() == 4000 and (tmp_path / "replay" / "tokens.bin").stat().st_size == 4000 * 4097 * 4
    assert peak < 16 << 20, f"{peak / 2**20:.0f} MiB held while writing"
