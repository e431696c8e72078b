"""Reading one night's drop into Spark from a local folder, S3 (SeaweedFS) and HDFS, side by side.

    .stoker/venv/bin/python bench/store_bench.py [--copies 8] [--repeat 3]

Makes a drop of ``--copies`` copies of the sample corpus's files (~2.3 MB each copy), puts it in a
local folder, a SeaweedFS bucket and a mini-cluster HDFS (both started here, on 127.0.0.1), and times
what tokenize_publish does before tokenising: the preflight listing, the provenance scan (every file
streamed once for its size and sha256), then the streaming parse into counted records.
Prints MB/s per store and each store's ratio to the local folder. Needs `make test-servers`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

from stoker import paths
from stoker.config.corpus import load_corpus
from stoker_local.servers import MiniHdfs, SeaweedS3


def drop(copies: int) -> dict[str, bytes]:
    sample = paths.state_dir() / "data" / "sample"
    files = sorted(p for p in sample.iterdir() if p.suffix == ".jsonl")
    if not files:
        sys.exit(f"no sample corpus in {sample}: run `make setup` first")
    return {f"c{c}-{p.name}": p.read_bytes() for c in range(copies) for p in files}


def time_read(spark, cfg, uri: str, repeat: int) -> float:
    from spark_jobs.read import opener_for, preflight_source, read_index, scan

    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        files = scan(spark, preflight_source(spark, cfg, uri), opener_for(cfg), cfg.source.format)
        read_index(spark, cfg, files).count()  # the index pass: every record read, parsed, validated
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from pyspark.sql import SparkSession

    from stoker.stores.connectors import s3a_jars

    files = drop(args.copies)
    mb = sum(map(len, files.values())) / 1e6
    cfg = load_corpus(paths.project_root() / "corpora" / "sample.yaml")
    with tempfile.TemporaryDirectory() as tmp, SeaweedS3(Path(tmp) / "s3") as s3, MiniHdfs(Path(tmp) / "hdfs") as h:
        local = Path(tmp) / "local"
        local.mkdir()
        s3.create_bucket("bench")
        for name, data in files.items():
            (local / name).write_bytes(data)
            s3.store().put(f"s3://bench/night/{name}", data)
            h.store().put(h.uri(f"/bench/night/{name}"), data)
        for k, v in s3.settings.to_env().items():
            os.environ[k] = v
        os.environ["PYSPARK_PYTHON"] = sys.executable
        spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                 .config("spark.jars", ",".join(map(str, s3a_jars()))).getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        uris = {"file": str(local), "s3": "s3://bench/night", "hdfs": h.uri("/bench/night")}
        seconds = {}
        for name, uri in uris.items():
            c = dataclasses.replace(cfg, source=dataclasses.replace(
                cfg.source, uri=uri, webhdfs_url=h.webhdfs_url if name == "hdfs" else None))
            time_read(spark, c, uri, 1)  # warm: JVM classes, S3A/HDFS clients, Python workers
            seconds[name] = time_read(spark, c, uri, args.repeat)
        spark.stop()
    print(f"drop: {len(files)} files, {mb:.1f} MB; Spark local[2]; best of {args.repeat}")
    for name, s in seconds.items():
        print(f"  {name:5s} {s:6.2f} s  {mb / s:6.1f} MB/s  {seconds['file'] / s:5.2f}x of file")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
