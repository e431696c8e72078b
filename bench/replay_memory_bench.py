"""Peak memory of replay at production sizes: the train task's draw and read (the worker), and a rank's pass
over its share of the rows.

    .stoker/venv/bin/python -m bench.replay_memory_bench [--sequences 1000000] [--seq-len 4096] [--replay 0.05]

An earlier night's topic of ``--sequences`` records of ``seq_len + 1`` uint16 ids (random ids: 8.2 GB at the
defaults, on the embedded broker, uncompressed) is the parent's lineage; a night of as many sequences replays
``replay_count(sequences, replay)`` of them (52,632 at the defaults). Each side runs in a process of its own
(``--side worker`` / ``--side rank``), so its peak is its own:

* **worker**: ``stoker.lines.replay.prepare``, what the train task runs before it launches the ranks: the draw,
  the read of the drawn records from Kafka, the rows written to the trainer folder.
* **rank**: one of two ranks opens the rows (``stoker.lines.replay_rows.ReplayRows``) and decodes every row of its
  share (``j mod 2``), as its mixer does over a night.

Each prints its peak resident set (``VmHWM``) and its peak anonymous memory (``RssAnon`` sampled, the part no other
process shares and the kernel cannot drop; a memory-mapped file's pages are page cache). ``--keep-topic`` keeps
the 8 GB topic for the next run. Needs `make setup`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from stoker import paths

PARTITIONS = 4


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


class _AnonPeak:
    """The peak of ``RssAnon`` sampled every 20 ms (the kernel keeps a peak only of the whole RSS)."""

    def __init__(self) -> None:
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _status_kib("RssAnon"))
            time.sleep(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, _status_kib("RssAnon"))


def _lineage(config: dict, topic: str, sequences: int) -> list[dict]:
    from stoker.kafka import offsets as koffsets

    ends, starts = koffsets.end_offsets(config, topic), koffsets.start_offsets(config, topic)
    per = {p: sequences // PARTITIONS + (1 if p < sequences % PARTITIONS else 0) for p in range(PARTITIONS)}
    return [{"ds": "2026-12-01", "corpus": "bench", "topic": topic, "sequences": sequences,
             "offsets": {str(p): [starts[p], ends[p]] for p in range(PARTITIONS)},
             "partition_sequences": {str(p): n for p, n in per.items()}}]


def make_topic(config: dict, topic: str, sequences: int, seq_len: int) -> None:
    """``sequences`` records of random ids, round-robin over the partitions, as the publisher encodes them."""
    import numpy as np

    from stoker.kafka import offsets as koffsets
    from stoker.kafka.clients import producer
    from stoker.run import records

    koffsets.recreate_topic(config, topic, PARTITIONS, 1, {"compression.type": "producer"})
    out = producer(config, **{"compression.type": "none", "linger.ms": 20, "batch.size": 1 << 20})
    rng = np.random.default_rng(0)
    headers = records.encode_headers("bench/2026-12-01", "uint16", [0, 1000, 3000], None)
    t0 = time.perf_counter()
    for start in range(0, sequences, 10_000):
        block = rng.integers(0, 50_000, size=(min(10_000, sequences - start), seq_len + 1), dtype=np.uint16)
        for j, row in enumerate(block):
            i = start + j
            while True:
                try:
                    out.produce(topic, value=row.tobytes(), key=records.make_key(0, i), partition=i % PARTITIONS,
                                headers=headers)
                    break
                except BufferError:
                    out.poll(0.5)
        out.poll(0)
    if out.flush(600) != 0:
        sys.exit("the bench topic was not written in 10 min")
    print(f"wrote {sequences:,} records to {topic} in {time.perf_counter() - t0:.0f} s", flush=True)


def side_worker(config: dict, topic: str, sequences: int, seq_len: int, share: float, folder: Path) -> dict:
    from stoker.lines.replay import prepare

    anon = _AnonPeak()
    manifest = SimpleNamespace(topic=f"{topic}.next", sequences=sequences, seq_len=seq_len)
    t0 = time.perf_counter()
    done = prepare(config, {"lineage": _lineage(config, topic, sequences)}, {"kind": "night", "path": "bench"},
                   manifest, share, folder / "replay", folder / "replay.json", lambda _: None)
    assert done is not None
    return {"side": "worker", "seconds": round(time.perf_counter() - t0, 1), "replayed": done["replayed"],
            "vm_hwm_mib": _status_kib("VmHWM") // 1024, "rss_anon_peak_mib": anon.stop() // 1024}


def side_rank(folder: Path, rank: int, world: int) -> dict:
    import numpy as np

    try:
        from stoker.lines.replay_rows import ReplayRows
    except ImportError:  # an earlier Stoker's tree first on PYTHONPATH (the comparison in BENCHMARKS.md)
        from stoker.lines.replay import ReplayRows  # type: ignore[attr-defined,no-redef]

    anon = _AnonPeak()
    t0 = time.perf_counter()
    rows, total, n = ReplayRows(folder / "replay"), 0, 0
    for i in range(rank, len(rows), world):
        seq = rows.sequence(i)
        total += int(np.asarray(seq.tokens[:8]).sum()) + len(seq.doc_starts)  # decoded, as the mixer does
        np.asarray(seq.tokens).max()  # every page of the row touched
        n += 1
    return {"side": f"rank {rank} of {world}", "seconds": round(time.perf_counter() - t0, 1), "rows": n,
            "vm_hwm_mib": _status_kib("VmHWM") // 1024, "rss_anon_peak_mib": anon.stop() // 1024}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sequences", type=int, default=1_000_000)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--replay", type=float, default=0.05)
    ap.add_argument("--keep-topic", action="store_true")
    ap.add_argument("--side", choices=("worker", "rank"))
    ap.add_argument("--topic")
    args = ap.parse_args()
    from stoker_local import broker

    config = broker.up().client_config()
    folder = paths.state_dir() / "bench" / "replay-memory"
    if args.side == "worker":
        print(json.dumps(side_worker(config, args.topic, args.sequences, args.seq_len, args.replay, folder)))
        return 0
    if args.side == "rank":
        print(json.dumps(side_rank(folder, 0, 2)))
        return 0
    from stoker.kafka import offsets as koffsets
    from stoker.kafka import topics as ktopics
    from stoker.lines.replay import replay_count

    topic = f"stoker.bench.replay-memory.s{args.sequences}.l{args.seq_len}"
    folder.mkdir(parents=True, exist_ok=True)
    have = sum(koffsets.end_offsets(config, topic).values()) if ktopics.topic_partitions(config, topic) else 0
    if have < args.sequences:
        make_topic(config, topic, args.sequences, args.seq_len)
    print(f"a night of {args.sequences:,} sequences at seq_len {args.seq_len}, train.replay {args.replay}: replays "
          f"{replay_count(args.sequences, args.replay):,} rows of {topic} (cores: {os.cpu_count()})", flush=True)
    common = ["--sequences", str(args.sequences), "--seq-len", str(args.seq_len), "--replay", str(args.replay),
              "--topic", topic]
    for side in ("worker", "rank"):
        res = subprocess.run([sys.executable, "-m", "bench.replay_memory_bench", "--side", side, *common],
                             capture_output=True, text=True, cwd=paths.project_root())
        if res.returncode != 0:
            sys.exit(f"{side} failed:\n{res.stdout[-3000:]}{res.stderr[-3000:]}")
        print(res.stdout.strip().splitlines()[-1], flush=True)
    print(f"rows on disk: {sum(f.stat().st_size for f in (folder / 'replay').iterdir()) / 2**20:,.0f} MiB")
    if not args.keep_topic:
        ktopics.delete_topics(config, [topic])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
