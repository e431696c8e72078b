"""The publish step alone against Kafka's own producer, side by side on the same broker and cores.

    .stoker/venv/bin/python bench/publish_bench.py [--records 50000] [--seq-len 2048] [--repeats 5]

Stoker's side is one pack task's publish path (``spark_jobs.publish.publish_partition``): distinct
sequences drawn from the sample corpus's token frequencies (``seq_len + 1`` uint16 ids each, with
their headers; the tool's payload is random A-Z, about as compressible), one
Kafka transaction, idempotent, ``acks=all``, the corpus default compression (zstd), ``linger.ms`` and
``batch.size`` as the job sets them. Kafka's side is ``org.apache.kafka.tools.ProducerPerformance``
from the ``kafka-tools`` jar with the same record size (value + headers), compression, acks,
idempotence, batching and one transaction. Both write a fresh 4-partition topic of the embedded
broker. Then both again with a transaction every 2 s (``--short-tx-ms``): the publisher
takes a new producer, and a new epoch, for each of its transactions, where the tool keeps one.
Prints records/s and MB/s of each, their ratio, and the peak RSS of this process (Stoker's side)
(the tool's JVMs run with -Xmx512m). Needs `make setup`.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import time

from spark_jobs import publish
from stoker import paths
from stoker.kafka import offsets as koffsets
from stoker.kafka import topics as ktopics
from stoker.layout import tasks_topic
from stoker.run import records
from stoker_local import broker, sample

PRODUCER = {"acks": "all", "enable.idempotence": "true", "compression.type": "zstd", "linger.ms": "20",
            "batch.size": str(1 << 20)}
"""What spark_jobs/publish.py's producer sets (the same names in librdkafka and the Java client)."""


def packed_sequences(n: int, seq_len: int) -> list:
    """``n`` distinct sequences of ids drawn from the sample corpus's token frequencies (about as
    compressible as real packed text; repeats of a few real sequences would flatter zstd), with a
    few document boundaries each."""
    import numpy as np

    from spark_jobs.steps import Packed
    from spark_jobs.tokenization import load_tokenizer

    tok = load_tokenizer(str(paths.state_dir() / "tokenizers" / "sample-bpe-8192" / "tokenizer.json"))
    texts = list(sample.texts(paths.state_dir() / "data" / "sample"))
    ids = np.concatenate([e.ids for e in tok.encode_batch(texts, add_special_tokens=False)])
    freq = np.bincount(ids, minlength=tok.get_vocab_size()).astype(np.float64)
    rng = np.random.default_rng(0)
    draws = np.concatenate([rng.choice(len(freq), size=(min(5000, n - i), seq_len + 1), p=freq / freq.sum())
                            .astype(np.uint16) for i in range(0, n, 5000)])
    return [Packed(tokens=row, doc_starts=[0, 700, 1500], valid=None) for row in draws]


def stoker_publish(config: dict, topic: str, seqs: list, run_id: str, tx_timeout_ms: int) -> tuple[float, int]:
    """Seconds and transactions of one task's publish of ``seqs``."""
    from spark_jobs.publish import TaskSummary, publish_partition

    t0 = time.perf_counter()
    done = list(publish_partition(iter(seqs), config=config, topic=topic, kafka_partitions=4, spark_partition=0,
                                  attempt=0, run_id=run_id, dtype="uint16", compression="zstd",
                                  tx_timeout_ms=tx_timeout_ms, summary=TaskSummary(spark_partition=0, attempt=0)))
    return time.perf_counter() - t0, done[0].transactions


def kafka_producer_performance(bootstrap: str, topic: str, n: int, size: int,
                               tx_ms: int = 3_600_000) -> tuple[float, str]:
    props = {"bootstrap.servers": bootstrap, **PRODUCER}
    cmd = broker.tool_command(
        "org.apache.kafka.tools.ProducerPerformance", "--topic", topic, "--num-records", str(n),
        "--record-size", str(size), "--throughput", "-1", "--transactional-id", f"bench-{topic}",
        "--transaction-duration-ms", str(tx_ms),
        "--producer-props", *[f"{k}={v}" for k, v in props.items()])
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if res.returncode != 0:
        sys.exit(f"ProducerPerformance failed: {res.stdout[-2000:]}{res.stderr[-2000:]}")
    final = [line for line in res.stdout.splitlines() if "records sent" in line][-1]
    rate = re.search(r"([\d.]+) records/sec", final)
    assert rate, final
    return n / float(rate.group(1)), final.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=5, help="runs of each side; the medians are printed")
    ap.add_argument("--short-tx-ms", type=int, default=2000, help="the second comparison's transaction length")
    args = ap.parse_args()
    b = broker.up()
    config = b.client_config()
    seqs = packed_sequences(args.records, args.seq_len)
    run_id = "bench/2026-12-01"
    headers = records.encode_headers(run_id, "uint16", seqs[0].doc_starts, seqs[0].valid)
    size = 2 * (args.seq_len + 1) + sum(len(k) + len(v) for k, v in headers) + len(records.make_key(0, 0))
    print(f"records: {args.records} of ~{size} bytes (value {2 * (args.seq_len + 1)} + key + headers), "
          f"zstd, acks=all, idempotent, 4 partitions; cores: {os.cpu_count()}")
    mb = args.records * size / 1e6
    warm = f"stoker.bench.warm.{time.time_ns()}"  # a just-started broker's coordinator is still loading
    koffsets.recreate_topic(config, warm, 4, 1, {})
    koffsets.recreate_topic(config, tasks_topic(warm), 1, 1, {})
    stoker_publish(config, warm, seqs[:1000], run_id, 900_000)
    ktopics.delete_topics(config, [warm, tasks_topic(warm)])
    for label, tx_ms in (("one transaction", None), (f"a transaction every {args.short_tx_ms} ms", args.short_tx_ms)):
        runs = []
        for _ in range(args.repeats):  # interleaved, so that a slow spell of the machine falls on both sides
            stamp = time.time_ns()
            topics = [f"stoker.bench.publish.{stamp}", f"stoker.bench.perf.{stamp}"]
            for t in topics:
                koffsets.recreate_topic(config, t, 4, 1, {"compression.type": "producer"})
            koffsets.recreate_topic(config, tasks_topic(topics[0]), 1, 1, {})
            # the publisher commits once a transaction has been open for half its timeout
            stoker_s, txs = stoker_publish(config, topics[0], seqs, run_id, 2 * tx_ms if tx_ms else 900_000)
            kafka_s, line = kafka_producer_performance(b.bootstrap, topics[1], args.records, size,
                                                       tx_ms or 3_600_000)
            runs.append((stoker_s, kafka_s, txs))
            ktopics.delete_topics(config, [*topics, tasks_topic(topics[0])])
        stoker_s = statistics.median(r[0] for r in runs)
        kafka_s = statistics.median(r[1] for r in runs)
        txs = round(statistics.median(r[2] for r in runs))
        print(f"-- {label} (median of {args.repeats})")
        print(f"stoker publish_partition : {stoker_s:6.2f} s  {args.records / stoker_s:9,.0f} records/s  "
              f"{mb / stoker_s:7.1f} MB/s  ({txs} transactions, each on a new producer)")
        print(f"kafka ProducerPerformance: {kafka_s:6.2f} s  {args.records / kafka_s:9,.0f} records/s  "
              f"{mb / kafka_s:7.1f} MB/s")
        print(f"ratio stoker / kafka     : {kafka_s / stoker_s:.2f}x")
    inits = []
    for i in range(args.repeats):  # what a fresh epoch costs a transaction: a new producer and its init
        t0 = time.perf_counter()
        fresh = publish._producer(config, f"bench-init-{stamp}-{i}", "zstd", 900_000)
        fresh.init_transactions(60)
        inits.append(time.perf_counter() - t0)
        fresh.close()
    print(f"a new producer and its init_transactions(): {statistics.median(inits) * 1000:.0f} ms (median)")
    print(f"peak RSS of this process (the records and Stoker's producers): "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB; the tool's JVMs run with -Xmx512m")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
