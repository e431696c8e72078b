"""Spark tokenisation throughput next to raw ``tokenizers`` encode_batch, same text, same cores.

    make bench            (or: .stoker/venv/bin/python bench/tokenize_bench.py --repeat 4)

Both sides tokenise the kept documents of the sample corpus (repeated --repeat times) with the
sample tokenizer. Raw: one process, ``encode_batch`` (its own thread pool over every core).
Spark: ``local[N]`` with ``mapInArrow``, the tokenizer loaded once per Python worker, input cached
in the JVM first so the timed action is tokenisation, Arrow transfer and the token count only.
Prints tokens/s of each and their ratio.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from stoker import paths
from stoker_local import sample


def bench_raw(texts: list[str], tokenizer: str, batch: int) -> tuple[int, float]:
    from spark_jobs.tokenization import encode_batch, load_tokenizer

    tok = load_tokenizer(tokenizer)
    t0 = time.perf_counter()
    n = sum(len(ids) for i in range(0, len(texts), batch) for ids in encode_batch(tok, texts[i:i + batch]))
    return n, time.perf_counter() - t0


def tokenize_count(tokenizer: str):
    def run(batches):
        import pyarrow as pa

        from spark_jobs.tokenization import encode_batch, load_tokenizer

        tok = load_tokenizer(tokenizer)
        for b in batches:
            ids = encode_batch(tok, b.column("text").to_pylist())
            yield pa.RecordBatch.from_pydict({"n": [sum(len(x) for x in ids)]})
    return run


def bench_spark(texts: list[str], tokenizer: str, cores: int, batch: int) -> tuple[int, float]:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master(f"local[{cores}]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             # one task per core already: the tokenizer's own thread pool would oversubscribe them
             .config("spark.executorEnv.TOKENIZERS_PARALLELISM", "false")
             .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(batch)).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.createDataFrame([(t,) for t in texts], "text string").repartition(cores * 2).cache()
    df.count()
    fn = tokenize_count(tokenizer)
    df.mapInArrow(fn, "n long").agg(F.sum("n")).collect()  # warm the Python workers
    t0 = time.perf_counter()
    n = df.mapInArrow(fn, "n long").agg(F.sum("n")).collect()[0][0]
    dt = time.perf_counter() - t0
    spark.stop()
    return n, dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=4, help="repeat the sample corpus this many times")
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--batch", type=int, default=2048)
    args = ap.parse_args()
    corpus = paths.state_dir() / "data" / "sample"
    tokenizer = str(paths.state_dir() / "tokenizers" / "sample-bpe-8192" / "tokenizer.json")
    texts = list(sample.texts(corpus)) * args.repeat
    mb = sum(len(t.encode()) for t in texts) / 1e6
    n_raw, t_raw = bench_raw(texts, tokenizer, args.batch)
    n_spark, t_spark = bench_spark(texts, tokenizer, args.cores, args.batch)
    assert n_raw == n_spark, (n_raw, n_spark)
    raw, spark = n_raw / t_raw, n_spark / t_spark
    print(f"text: {len(texts)} docs, {mb:.1f} MB, {n_raw} tokens; cores: {args.cores}")
    print(f"raw tokenizers encode_batch : {raw:12,.0f} tokens/s  ({t_raw:.2f} s)")
    print(f"spark local[{args.cores}] mapInArrow  : {spark:12,.0f} tokens/s  ({t_spark:.2f} s)")
    print(f"ratio spark / raw           : {spark / raw:.2f}x")


if __name__ == "__main__":
    main()
