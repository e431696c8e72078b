"""The publish step alone against Kafka's own producer, side by side on the same broker and cores.

    .stoker/venv/bin/python bench/publish_bench.py [--records 50000] [--seq-len 2048]

Stoker's side is one pack task's publish path (``spark_jobs.publish.publish_partition``): distinct
sequences drawn from the sample corpus's token frequencies (``seq_len + 1`` uint16 ids each, with
their headers; the tool's payload is random A-Z, about as compressible), one
Kafka transaction, idempotent, ``acks=all``, the corpus default compression (zstd), ``linger.ms`` and
``batch.size`` as the job sets them. Kafka's side is ``org.apache.kafka.tools.ProducerPerformance``
from the ``kafka-tools`` jar with the same record size (value + headers), compression, acks,
idempotence, batching and one transaction. Both write a fresh 4-partition topic of the embedded
broker. Prints records/s and MB/s of each and their ratio. Needs `make setup`.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

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


def stoker_publish(config: dict, topic: str, seqs: list, run_id: str) -> float:
    from spark_jobs.publish import TaskSummary, publish_partition

    t0 = time.perf_counter()
    for _ in publish_partition(iter(seqs), config=config, topic=topic, kafka_partitions=4, spark_partition=0,
                               attempt=0, run_id=run_id, dtype="uint16", compression="zstd",
                               tx_timeout_ms=900_000, summary=TaskSummary(spark_partition=0, attempt=0)):
        pass
    return time.perf_counter() - t0


def kafka_producer_performance(bootstrap: str, topic: str, n: int, size: int) -> tuple[float, str]:
    props = {"bootstrap.servers": bootstrap, **PRODUCER}
    cmd = broker.tool_command(
        "org.apache.kafka.tools.ProducerPerformance", "--topic", topic, "--num-records", str(n),
        "--record-size", str(size), "--throughput", "-1", "--transactional-id", f"bench-{topic}",
        "--transaction-duration-ms", str(3_600_000),
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
    args = ap.parse_args()
    b = broker.up()
    config = b.client_config()
    seqs = packed_sequences(args.records, args.seq_len)
    run_id = "bench/2026-12-01"
    headers = records.encode_headers(run_id, "uint16", seqs[0].doc_starts, seqs[0].valid)
    size = 2 * (args.seq_len + 1) + sum(len(k) + len(v) for k, v in headers) + len(records.make_key(0, 0))
    stamp = time.time_ns()
    topics = [f"stoker.bench.publish.{stamp}", f"stoker.bench.perf.{stamp}"]
    for t in topics:
        koffsets.recreate_topic(config, t, 4, 1, {"compression.type": "producer"})
    koffsets.recreate_topic(config, tasks_topic(topics[0]), 1, 1, {})
    stoker_s = stoker_publish(config, topics[0], seqs, run_id)
    kafka_s, line = kafka_producer_performance(b.bootstrap, topics[1], args.records, size)
    mb = args.records * size / 1e6
    print(f"records: {args.records} of ~{size} bytes (value {2 * (args.seq_len + 1)} + key + headers), "
          f"zstd, acks=all, idempotent, one transaction, 4 partitions; cores: {os.cpu_count()}")
    print(f"stoker publish_partition : {stoker_s:6.1f} s  {args.records / stoker_s:9,.0f} records/s  "
          f"{mb / stoker_s:7.1f} MB/s")
    print(f"kafka ProducerPerformance: {kafka_s:6.1f} s  {args.records / kafka_s:9,.0f} records/s  "
          f"{mb / kafka_s:7.1f} MB/s  ({line})")
    print(f"ratio stoker / kafka     : {kafka_s / stoker_s:.2f}x")
    ktopics.delete_topics(config, [*topics, tasks_topic(topics[0])])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
