"""Replay against forgetting (``train.replay``): a share of each night's training sequences comes from the
nights its model already holds, so continuing the line does not erase what earlier nights taught it.

* **What is drawn.** The night's parent is a night of the line: its record's ``lineage`` lists every night
  the model was trained on, each with its topic and per-partition offsets ``[start, end)``. With share ``r``
  the night replays ``R = round(S * r / (1 - r))`` sequences (``S``: its own), so replayed rows are ``r`` of
  what it trains; at most every earlier sequence once. The ``R`` offsets are drawn without replacement,
  uniformly over the earlier nights' records, by a generator seeded with the night's topic: a relaunch,
  another worker or another host draws the same. A draw names a record by its partition and its index in the
  night's range (the night records each partition's count; transaction markers take offsets, so offsets
  cannot name records), and reading scans the partition's range from its start.
* **Where it is read.** The train task's launch reads the drawn records from their topics (read_committed,
  each partition's range from its start up to its last drawn record) and streams them, decoded, one at a time
  into the trainer's folder (``replay/``, one memory-mapped file per field: :mod:`stoker.lines.replay_rows`),
  with the draw (``replay.json``: the parent, the share, per topic what was drawn, read,
  and missing). A relaunch reuses both while the parent is the same, so the night stays deterministic and
  exactly resumable. Records of another ``seq_len`` are counted and skipped (a batch has one length).
* **The line's replay store.** When a night of a replaying line joins it, it leaves in its night folder
  (``replay_store/``) ``R`` of its own records (``R`` for its own size and share), drawn the same way and
  read while its topic surely exists. Draws whose records retention already deleted (or whose topic is gone)
  are taken from their night's store instead, chosen by the same seed, as far as it holds them; what neither
  holds is counted as missing and named: the night replays fewer, never fails for it.
* **How it is trained** (``training/data/replay.py``): replayed rows are spread evenly over the night, per
  partition of the night's topic, and how many each partition has trained is in the checkpoint beside the
  offsets. The keys audit lists them apart (``replayed``, as ``replay:<topic>:<key>``).

No torch, Airflow or Spark here; numpy and the Kafka client only.
"""

from __future__ import annotations

import bisect
import json
import logging
import random
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from stoker.exceptions import StokerError
from stoker.files import atomic_write_json
from stoker.lines.replay_rows import ReplayRows, RowWriter, remove_rows, rows_present

log = logging.getLogger("stoker.lines.replay")

REPLAY_MAX = 0.5
"""``train.replay`` at most: half of a night's rows from earlier nights."""
KEY_PREFIX = b"replay:"
"""A replayed row's key in the batch and the keys audit: ``replay:<topic>:<its key>``."""


def replay_count(sequences: int, share: float) -> int:
    """How many earlier sequences a night of ``sequences`` replays at ``share``."""
    return round(sequences * share / (1.0 - share)) if share > 0 else 0


def draw(lineage: list[dict[str, Any]], sequences: int, share: float, seed: str) -> dict[str, dict[int, list[int]]]:
    """Per topic and partition, the sorted indices of the records drawn (the k-th record of the partition's
    range) from the earlier nights of ``lineage``."""
    ranges = [(str(e["topic"]), int(p), _count(e, p, s, t)) for e in lineage if e.get("topic")
              for p, (s, t) in sorted(e.get("offsets", {}).items(), key=lambda kv: int(kv[0]))]
    ranges = [r for r in ranges if r[2] > 0]
    total = sum(n for _, _, n in ranges)
    want = min(replay_count(sequences, share), total)
    if want == 0:
        return {}
    starts, at = [], 0
    for _, _, n in ranges:
        starts.append(at)
        at += n
    picks: dict[str, dict[int, list[int]]] = {}
    for pos in sorted(random.Random(seed).sample(range(total), want)):
        i = bisect.bisect_right(starts, pos) - 1
        topic, p, _ = ranges[i]
        picks.setdefault(topic, {}).setdefault(p, []).append(pos - starts[i])
    return picks


def _count(entry: dict[str, Any], p: str, start: int, end: int) -> int:
    """The records in a partition's range: recorded with the night (``partition_sequences``); a night of an
    earlier Stoker has only offsets, an upper bound (transaction markers take offsets too)."""
    return int(entry.get("partition_sequences", {}).get(p, end - start))


def _records(reader: Any, topic: str, p: int, start: int, end: int, timeout: float) -> Iterator[Any]:
    """The committed records of ``topic[p]`` from offset ``start`` up to ``end``."""
    from confluent_kafka import KafkaError, TopicPartition

    reader.assign([TopicPartition(topic, p, start)])
    deadline = time.monotonic() + timeout
    while True:
        msg = reader.poll(1.0)
        if msg is None:
            if time.monotonic() > deadline:
                raise StokerError(f"replay: reading {topic}[{p}] in [{start}, {end}): no record in {timeout:.0f}s: "
                                  "is the broker up?")
            continue
        deadline = time.monotonic() + timeout
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF and msg.offset() >= end:
                return  # only transaction markers were left in the range
            if err.code() != KafkaError._PARTITION_EOF:
                raise StokerError(f"replay: reading {topic}[{p}]: {err}")
            continue
        yield msg
        if msg.offset() + 1 >= end:
            return


def _read_partition(reader: Any, topic: str, p: int, indices: list[int], span: tuple[int, int], seq_len: int,
                    timeout: float, sink: Callable[[bytes, Any], None]) -> tuple[int, int]:
    """The drawn records of one partition (by their index in the range ``span``), decoded into ``sink`` one at a
    time; how many were read and how many had another length. Fewer when the range holds fewer records than an
    index. The scan ends at the last drawn record."""
    from stoker.run import records

    read, other_length, i = 0, 0, 0
    for k, msg in enumerate(_records(reader, topic, p, span[0], span[1], timeout)):
        if k != indices[i]:
            continue
        i += 1
        try:
            seq = records.decode(msg.value(), msg.headers(), seq_len)
        except records.RecordError:
            other_length += 1
        else:
            sink(KEY_PREFIX + f"{topic}:".encode() + msg.key(), seq)
            read += 1
        if i == len(indices):
            break
    return read, other_length


def read_drawn(config: Mapping[str, Any], picks: dict[str, dict[int, list[int]]],
               ranges: dict[str, dict[int, tuple[int, int]]], seq_len: int, sink: Callable[[bytes, Any], None],
               timeout: float = 120.0) -> dict[str, dict[str, int]]:
    """The drawn records, decoded into ``sink`` as they are read (nothing is held); per topic: drawn, read,
    missing (deleted), other_length. ``ranges``: per topic and partition, its night's offset range ``(start, end)``."""
    from stoker.kafka import offsets as koffsets
    from stoker.kafka.clients import Role, consumer

    stats: dict[str, dict[str, int]] = {}
    reader = consumer(config, Role.READER, "stoker-replay")
    try:
        for topic, parts in sorted(picks.items()):
            st = stats[topic] = {"drawn": sum(map(len, parts.values())), "read": 0, "missing": 0, "other_length": 0,
                                 "from_store": 0}
            try:
                earliest = koffsets.start_offsets(config, topic)
            except StokerError:
                earliest = {}
            for p, indices in sorted(parts.items()):
                start, end = ranges[topic][p]
                if p not in earliest or earliest[p] > start:  # retention deleted (some of) its range
                    st["missing"] += len(indices)
                    continue
                got, other = _read_partition(reader, topic, p, indices, (start, end), seq_len, timeout, sink)
                st["read"] += got
                st["other_length"] += other
                st["missing"] += len(indices) - got - other
    finally:
        reader.close()
    return stats


def keep_store(config: Mapping[str, Any], manifest: Any, share: float, out: Path) -> int:
    """The night's own contribution to its line's replay store: ``replay_count(its sequences, share)`` of its
    records, drawn like a replay (seeded by its topic) and read from its topic while it surely exists (the night
    just trained), for later nights to replay once retention has deleted the topic. The rows kept."""
    entry = {"topic": manifest.topic, "sequences": manifest.sequences,
             "offsets": {str(p.partition): [p.start_offset, p.end_offset] for p in manifest.partitions},
             "partition_sequences": {str(p.partition): p.sequences for p in manifest.partitions}}
    picks = draw([entry], manifest.sequences, share, seed=f"store:{manifest.topic}")
    spans = {p.partition: (p.start_offset, p.end_offset) for p in manifest.partitions}
    writer = RowWriter(out, manifest.seq_len)
    try:
        read_drawn(config, picks, {manifest.topic: spans}, manifest.seq_len, writer.add)
    except BaseException:
        writer.abandon()
        raise
    return writer.close()


def _from_store(store: Path | None, want: int, seed: str, sink: Callable[[bytes, Any], None]) -> int:
    """``want`` rows of an earlier night's store (fewer when it holds fewer), chosen by ``seed``, into ``sink``."""
    if store is None or not rows_present(store) or want <= 0:
        return 0
    rows = ReplayRows(store)
    chosen = sorted(random.Random(seed).sample(range(len(rows)), min(want, len(rows))))
    for i in chosen:
        sink(rows.key(i), rows.sequence(i))
    return len(chosen)


def prepare(config: Mapping[str, Any], parent_record: dict[str, Any], parent: dict[str, Any], manifest: Any,
            share: float, npz: Path, record: Path,
            store_of: Callable[[dict[str, Any]], Path | None]) -> dict[str, Any] | None:
    """The night's replay rows in ``npz`` and its draw in ``record``, drawn and read once per parent (a relaunch
    with the same parent reuses them); None and both files removed when the night replays nothing. Draws whose
    records are gone come from their night's store (``store_of(lineage entry)``) as far as it holds them."""
    if record.is_file() and rows_present(npz):
        done = json.loads(record.read_text())
        if done.get("parent") == parent and done.get("share") == share and done.get("topic") == manifest.topic:
            return dict(done)
    remove_rows(npz)
    record.unlink(missing_ok=True)
    lineage = [e for e in parent_record.get("lineage", []) if e.get("topic")]
    picks = draw(lineage, manifest.sequences, share, seed=manifest.topic) if share > 0 else {}
    if not picks:
        return None
    ranges = {str(e["topic"]): {int(p): (int(f), int(t)) for p, (f, t) in e["offsets"].items()} for e in lineage}
    t0 = time.perf_counter()
    writer = RowWriter(npz, manifest.seq_len)
    try:
        stats = read_drawn(config, picks, ranges, manifest.seq_len, writer.add)
        for e in lineage:
            st = stats.get(str(e["topic"]))
            if st and st["missing"]:
                stored = _from_store(store_of(e), st["missing"], f"{manifest.topic}:{e['topic']}", writer.add)
                st["from_store"], st["missing"] = stored, st["missing"] - stored
    except BaseException:
        writer.abandon()
        raise
    replayed = writer.close()
    done = {"parent": parent, "share": share, "topic": manifest.topic, "sequences": manifest.sequences,
            "drawn": sum(s["drawn"] for s in stats.values()), "replayed": replayed,
            "topics": stats, "seconds": round(time.perf_counter() - t0, 2),
            "nights": [{k: e.get(k) for k in ("ds", "corpus", "topic", "sequences")} for e in lineage]}
    atomic_write_json(record, done)
    for topic, st in stats.items():
        if st["missing"] or st["other_length"]:
            log.warning("replay: %d of %d drawn sequences of %s are gone (retention deleted them, or the topic, and "
                        "its night's store holds no more) and %d have another seq_len: the night replays %d, not %d",
                        st["missing"], st["drawn"], topic, st["other_length"], done["replayed"], done["drawn"])
    return done
