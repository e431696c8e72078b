"""Tokenisation throughput of each backend, raw and in Spark, same text, same cores, ids compared.

    make bench            (or: .stoker/venv/bin/python -m bench.tokenize_bench --repeat 32 --varied-mb 64)

Two texts: the kept documents of the sample corpus (repeated ``--repeat`` times: the generator's texts repeat,
which flatters any cache of words) and ``--varied-mb`` of distinct documents, the Python sources and docs of this
install cut at blank lines into documents of up to 8 KB (deterministic for a given lock file). Both are
tokenised by the sample tokenizer (byte-level BPE, vocab 8192) with:

* raw ``tokenizers`` ``encode_batch`` in one process (its own thread pool over every core);
* raw ``fastokens`` ``encode_batch_flat`` in one process (its own threads over every core);
* Spark ``local[N]`` ``mapInArrow`` with each backend as the pack pass loads it
  (:func:`spark_jobs.tokenizer_backends.encoders`, one thread a task), input cached in the JVM first so the
  timed action is tokenisation, Arrow transfer and the token count only.

The ids of every document are compared between the two libraries (untimed); any difference fails the bench.
Prints tokens/s, MB/s, the ratios, and the peak resident memory of this process and of the Spark tree.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import sysconfig
import time
from pathlib import Path

from bench.scale_bench import PeakRss
from stoker import paths
from stoker_local import sample


def varied_texts(mb: float, doc_bytes: int = 8192) -> list[str]:
    """Distinct documents from the Python sources and docs of this install, in path order."""
    roots = [Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"])]
    out, total = [], 0
    for root in roots:
        for p in sorted(root.rglob("*")):
            if p.suffix not in (".py", ".md", ".rst", ".txt") or not p.is_file():
                continue
            try:
                text = p.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            doc: list[str] = []
            for para in text.split("\n\n"):
                doc.append(para)
                if sum(map(len, doc)) >= doc_bytes:
                    out.append("\n\n".join(doc))
                    total, doc = total + len(out[-1]), []
            if doc and doc[0].strip():
                out.append("\n\n".join(doc))
                total += len(out[-1])
            if total >= mb * 1e6:
                return out
    return out


def raw_tokenizers(texts: list[str], tokenizer_json: str, batch: int) -> tuple[int, float]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_json)
    tok.encode_special_tokens = True
    t0 = time.perf_counter()
    n = sum(len(e.ids) for i in range(0, len(texts), batch)
            for e in tok.encode_batch(texts[i:i + batch], add_special_tokens=False))
    return n, time.perf_counter() - t0


def raw_fastokens(texts: list[str], tokenizer_json: str, batch: int) -> tuple[int, float]:
    import fastokens

    tok = fastokens.Tokenizer.from_json_str(tokenizer_json)
    t0 = time.perf_counter()
    n = sum(len(tok.encode_batch_flat(texts[i:i + batch], add_special_tokens=False, split_special_tokens=True)[0])
            for i in range(0, len(texts), batch)) // 4
    return n, time.perf_counter() - t0


def compare_ids(texts: list[str], tokenizer_json: str, batch: int = 1024) -> int:
    """Documents whose ids differ between the two libraries (all of them compared)."""
    from spark_jobs.tokenizer_backends import fast_encoder, reference_encoder, same_ids

    fast, ref = fast_encoder(tokenizer_json), reference_encoder(tokenizer_json)
    bad = 0
    for i in range(0, len(texts), batch):
        b = texts[i:i + batch]
        bad += sum(not same_ids(x, y) for x, y in zip(fast.encode_batch(b), ref.encode_batch(b), strict=True))
    return bad


def tokenize_count(tokenizer_json: str, backend: str):
    def run(batches):
        import pyarrow as pa

        from spark_jobs.tokenizer_backends import encoders

        enc = encoders("bench", tokenizer_json, backend)[0]
        for b in batches:
            ids = enc.encode_batch(b.column("text").to_pylist())
            yield pa.RecordBatch.from_pydict({"n": [sum(len(x) for x in ids)]})
    return run


def bench_spark(texts: list[str], tokenizer_json: str, cores: int, batch: int,
                backends: list[str]) -> dict[str, tuple[int, float, int]]:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master(f"local[{cores}]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             # one task per core already: each library's own thread pool would oversubscribe them (as the job)
             .config("spark.executorEnv.TOKENIZERS_PARALLELISM", "false")
             .config("spark.executorEnv.RAYON_NUM_THREADS", "1")
             .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(batch)).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.createDataFrame([(t,) for t in texts], "text string").repartition(cores * 2).cache()
    df.count()
    out = {}
    for backend in backends:
        fn = tokenize_count(tokenizer_json, backend)
        df.mapInArrow(fn, "n long").agg(F.sum("n")).collect()  # warm the Python workers
        rss = PeakRss(os.getpid(), every=0.05)
        rss.start()
        t0 = time.perf_counter()
        n = df.mapInArrow(fn, "n long").agg(F.sum("n")).collect()[0][0]
        out[backend] = (n, time.perf_counter() - t0, rss.stop())
    spark.stop()
    return out


def run(name: str, texts: list[str], tokenizer_json: str, cores: int, batch: int) -> None:
    mb = sum(len(t.encode()) for t in texts) / 1e6
    n_ref, t_ref = raw_tokenizers(texts, tokenizer_json, batch)
    n_fast, t_fast = raw_fastokens(texts, tokenizer_json, batch)
    differ = compare_ids(texts, tokenizer_json)
    spark = bench_spark(texts, tokenizer_json, cores, batch, ["tokenizers", "fastokens"])
    counts = {n_ref, n_fast, *(n for n, _, _ in spark.values())}
    print(f"== {name}: {len(texts):,} docs, {mb:.1f} MB, {n_ref:,} tokens; cores: {cores}; "
          f"ids differ on {differ} of {len(texts):,} documents")
    print(f"raw tokenizers encode_batch    : {n_ref / t_ref:14,.0f} tokens/s {mb / t_ref:8.1f} MB/s ({t_ref:.2f} s)")
    print(f"raw fastokens encode_batch_flat: {n_fast / t_fast:14,.0f} tokens/s {mb / t_fast:8.1f} MB/s "
          f"({t_fast:.2f} s)  {t_ref / t_fast:.1f}x tokenizers")
    for backend, (n, dt, peak) in spark.items():
        print(f"spark local[{cores}] {backend:10s}   : {n / dt:14,.0f} tokens/s {mb / dt:8.1f} MB/s ({dt:.2f} s)  "
              f"peak RSS (driver tree) {peak / 2**30:.2f} GiB")
    (_, ts_ref, _), (_, ts_fast, _) = spark["tokenizers"], spark["fastokens"]
    print(f"spark fastokens / tokenizers   : {ts_ref / ts_fast:.1f}x;  spark tokenizers / raw tokenizers: "
          f"{t_ref / ts_ref:.2f}x", flush=True)
    if differ or len(counts) != 1:
        sys.exit(f"{name}: {differ} documents with other ids; token counts {sorted(counts)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=32, help="repeat the sample corpus this many times")
    ap.add_argument("--varied-mb", type=float, default=64, help="MB of distinct documents (0: none)")
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--batch", type=int, default=2048)
    args = ap.parse_args()
    corpus = paths.state_dir() / "data" / "sample"
    tokenizer_json = (paths.state_dir() / "tokenizers" / "sample-bpe-8192" / "tokenizer.json").read_text()
    run(f"sample corpus x{args.repeat}", list(sample.texts(corpus)) * args.repeat, tokenizer_json, args.cores,
        args.batch)
    if args.varied_mb:
        run("varied (this install's Python sources and docs)", varied_texts(args.varied_mb), tokenizer_json,
            args.cores, args.batch)
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
