"""The Kafka token source next to a numpy memmap reader of the same sequences, same batches; and a mixture
night's source (three topics at 0.6/0.3/0.1, training/data/mixture_source.py) over the same sequences.

    .stoker/venv/bin/python bench/source_bench.py [--sequences 20000] [--seq-len 256] [--batch 8]

Publishes N random packed sequences (uint16, two documents each) to a fresh topic of the embedded
broker (started if needed) with the production record format, and writes the same sequences to a
.npy file. Then reads both into training batches (inputs, labels, per-document position ids):
KafkaTokenSource (read_committed consumer, decode, make_batch) against np.load(mmap_mode="r")
slices through the same make_batch. The same sequences are also published split over three topics (60%, 30%,
10%) and read by MixtureSource at those shares: its deal, per-record take and per-component accounting are
what it adds over one topic's source. Prints tokens/s of each, the ratios, and each reader's peak resident
memory above the process's before it (librdkafka's buffers included).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from stoker.kafka import offsets as koffsets
from stoker.kafka import topics as ktopics
from stoker.run import records
from stoker.run.manifest import Manifest, PartitionRange
from stoker.run.records import PackedSequence
from stoker_local import broker as stack
from training.data.batch import make_batch
from training.data.kafka_source import KafkaTokenSource


def publish(config: dict, topic: str, data: np.ndarray, partitions: int) -> Manifest:
    from confluent_kafka import Producer

    koffsets.recreate_topic(config, topic, partitions)
    producer = Producer({**config, "transactional.id": topic, "acks": "all", "compression.type": "zstd",
                         "linger.ms": 20})
    producer.init_transactions(30)
    producer.begin_transaction()
    counts = [0] * partitions
    starts = [0, data.shape[1] // 3]
    for i, row in enumerate(data):
        p = i % partitions
        while True:
            try:
                producer.produce(topic, key=records.make_key(0, i), value=records.encode_value(row, "uint16"),
                                 partition=p, headers=records.encode_headers("bench", "uint16", doc_starts=starts))
                break
            except BufferError:
                producer.poll(0.2)
        counts[p] += 1
    producer.commit_transaction(60)
    ends = koffsets.stable_end_offsets(config, topic)
    seq_len = data.shape[1] - 1
    return Manifest(run_id="bench", corpus="bench", ds="2026-12-02", topic=topic,
                    partitions=[PartitionRange(partition=p, start_offset=0, end_offset=ends[p], sequences=counts[p])
                                for p in range(partitions)],
                    seq_len=seq_len, dtype="uint16", tokenizer_path="", tokenizer_sha256="", vocab_size=8192,
                    docs_in=0, docs_kept=0, docs_dropped={}, tokens=data.size, padding_tokens=0,
                    sequences=len(data), source_uri="bench")


def read_kafka(config: dict, m: Manifest, batch: int) -> tuple[int, float]:
    src = KafkaTokenSource(kafka_config=config, manifest=m, rank=0, world=1, batch_size=batch,
                           group_id="stoker-bench")
    return _drain(src)


def _drain(src: Any, mixture: bool = False) -> tuple[int, float]:
    tokens, t0 = 0, time.perf_counter()
    while (pending := src.next_batch()) is not None:
        src.mark_trained(pending)
        if mixture:
            src.account(src.local_counts(pending))
        tokens += pending.batch.input_ids.size
    dt = time.perf_counter() - t0
    src.close()
    return tokens, dt


SHARES = {"web": 0.6, "code": 0.3, "papers": 0.1}


def publish_mixture(config: dict, data: np.ndarray, partitions: int, folder: Path) -> Any:
    """The sequences split over three topics at :data:`SHARES` (rows in order), their manifests and the plan."""
    from stoker.lines.mix_plan import plan_mixture
    from stoker.lines.mixture import Mix, hamilton
    from stoker.run.manifest import write_manifest

    sizes, at, paths = hamilton(len(data), SHARES), 0, {}
    for name in sorted(SHARES):
        m = publish(config, f"stoker.bench.source.{name}", data[at:at + sizes[name]], partitions)
        at += sizes[name]
        paths[name] = write_manifest(folder / name, m)
    return plan_mixture(Mix(shares=SHARES), paths)


def read_mixture(config: dict, plan: Any, batch: int) -> tuple[int, float]:
    from training.data.mixture_source import MixtureSource

    src = MixtureSource(kafka_config=config, plan=plan, manifests=plan.read_manifests(), rank=0, world=1,
                        micro_batch_size=batch, accumulation=1, group_id="stoker-bench")
    return _drain(src, mixture=True)


def peak_above(fn: Any, *args: Any) -> tuple[tuple[int, float], int]:
    """``fn(*args)`` and the process's peak resident memory above what it was before, sampled every 50 ms."""
    import os

    import psutil

    from bench.scale_bench import PeakRss

    before = psutil.Process().memory_info().rss
    watch = PeakRss(os.getpid(), every=0.05)
    watch.start()
    out = fn(*args)
    return out, max(watch.stop() - before, 0)


def read_memmap(path: Path, batch: int, seq_len: int) -> tuple[int, float]:
    t0 = time.perf_counter()
    mm = np.load(path, mmap_mode="r")
    starts = np.array([0, mm.shape[1] // 3], dtype="<u4")
    tokens = 0
    for i in range(0, len(mm), batch):
        rows = mm[i:i + batch]
        b = make_batch([PackedSequence(tokens=r, run_id="bench", doc_starts=starts) for r in rows],
                       [b""] * len(rows), seq_len)
        tokens += b.input_ids.size
    return tokens, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sequences", type=int, default=20000)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=5, help="reads of each; the best time of each counts")
    args = ap.parse_args()
    config = stack.up().client_config()
    data = np.random.default_rng(0).integers(0, 8192, (args.sequences, args.seq_len + 1), dtype=np.uint16)
    m = publish(config, "stoker.bench.source", data, args.partitions)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "seqs.npy"
        np.save(path, data)
        plan = publish_mixture(config, data, args.partitions, Path(tmp))
        runs = [(peak_above(read_memmap, path, args.batch, args.seq_len), peak_above(read_kafka, config, m, args.batch),
                 peak_above(read_mixture, config, plan, args.batch))
                for _ in range(args.repeat)]  # interleaved, best of each: the machine's noise hits all
        best = [min((r[i] for r in runs), key=lambda x: x[0][1]) for i in range(3)]
        peaks = [max(r[i][1] for r in runs) for i in range(3)]
        topics = [m.topic, *(mm.topic for mm in plan.read_manifests().values())]
    (n_mm, t_mm), (n_kf, t_kf), (n_mx, t_mx) = (b[0] for b in best)
    assert n_mm == n_kf == n_mx == args.sequences * args.seq_len, (n_mm, n_kf, n_mx)
    print(f"{args.sequences} sequences x {args.seq_len + 1} uint16, batches of {args.batch}, "
          f"{args.partitions} partitions (zstd), best of {args.repeat}; peak RSS above the start, largest of the runs")
    print(f"numpy memmap reader  : {n_mm / t_mm:14,.0f} tokens/s  ({t_mm:.2f} s)  peak +{peaks[0] >> 20} MiB")
    print(f"KafkaTokenSource     : {n_kf / t_kf:14,.0f} tokens/s  ({t_kf:.2f} s)  peak +{peaks[1] >> 20} MiB")
    print(f"MixtureSource (3)    : {n_mx / t_mx:14,.0f} tokens/s  ({t_mx:.2f} s)  peak +{peaks[2] >> 20} MiB")
    print(f"ratio kafka / memmap : {t_mm / t_kf:.2f}x")
    print(f"ratio mixture / kafka: {t_kf / t_mx:.2f}x")
    ktopics.delete_topics(config, topics)


if __name__ == "__main__":
    main()
