"""The Spark stage at real sizes through tokenize_publish at the default settings, next to raw
``tokenizers`` encode_batch with parsing on the same files and cores.

    .stoker/venv/bin/python bench/scale_bench.py [--shape mixed|single] [--big-mb 2200]

Makes a deterministic corpus offline (``--shape mixed``: one plain JSONL file of 2.2 GB, 200 files of
1 MB, 320 MB of ``.jsonl.zst`` in 40 MB files, and a Parquet corpus of 300 MB of text in 4 files with
extra columns; ``single``: one 300 MB file). Documents are the sample corpus's texts with a counter:
one in 50 repeats an earlier one exactly, one in 1000 is broken JSON. Each format runs
``spark-submit spark_jobs/tokenize_publish.py`` with the operator's default Spark settings against
the embedded broker, sampling the resident memory of every process of that run (JVM, Python
workers) twice a second. The raw side reads the same files in one process (``json.loads`` each line,
or the Parquet text column) and tokenises with ``encode_batch`` (its own thread pool over every
core). Prints tokens/s of each, their ratio, the peak memory, and how the stage's time split (from
its progress lines). Needs `make setup`; the broker is started if needed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from stoker import paths
from stoker.kafka import topics as ktopics
from stoker.layout import RunLayout, tasks_topic
from stoker.run.plan import plan_run
from stoker_local import broker, sample


def documents(start: int = 0):
    """Endless JSONL lines, deterministic: distinct texts (the sample's with a counter), one in 50 an exact
    repeat of an earlier one (dedup's work at scale), one in 1000 broken JSON (the quarantine's)."""
    texts = list(sample.texts(paths.state_dir() / "data" / "sample"))
    n = start
    while True:
        if n % 1000 == 999:
            yield n, None
        else:
            m = n - 49 if n % 50 == 49 else n
            yield n, f"{texts[m % len(texts)]}\n[{m}]"
        n += 1


def _line(n: int, text: str | None) -> bytes:
    return (json.dumps({"id": n, "text": text}) if text is not None else f'{{"id": {n}, "text": "broken').encode()


def write_jsonl(path: Path, docs, mb: float) -> None:
    """A JSONL file of about ``mb`` MB of uncompressed text (``.zst``: compressed as it is written)."""
    raw = open(path, "wb")  # noqa: SIM115 - closed below, through the compressor when there is one
    out = raw
    if path.suffix == ".zst":
        import zstandard

        out = zstandard.ZstdCompressor(level=3).stream_writer(raw)
    size = 0
    while size < mb * 1e6:
        line = _line(*next(docs)) + b"\n"
        out.write(line)
        size += len(line)
    out.close()
    if not raw.closed:
        raw.close()


def write_parquet(path: Path, docs, mb: float, rows_per_group: int = 50_000) -> None:
    """Parquet with the text column among others (a projection reads only ``text``); broken rows are
    null texts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with pq.ParquetWriter(path, pa.schema([("id", pa.int64()), ("text", pa.string()),
                                           ("url", pa.string())])) as w:
        size = 0
        while size < mb * 1e6:
            rows = [next(docs) for _ in range(rows_per_group)]
            ids, texts = [r[0] for r in rows], [r[1] for r in rows]
            size += sum(len(t or "") for t in texts)
            w.write_table(pa.table({"id": ids, "text": texts, "url": [f"https://example.org/{i}" for i in ids]}))


def make_corpus(folder: Path, shape: dict[str, float]) -> None:
    """``shape``: the MB of one big plain file, of ``small`` 1 MB files, of ``zst`` .zst files of 40 MB
    (decompressed), and of Parquet (a folder of its own: a corpus has one format)."""
    docs = documents()
    folder.mkdir(parents=True, exist_ok=True)
    if shape.get("big"):
        write_jsonl(folder / "big-00000.jsonl", docs, shape["big"])
    for i in range(int(shape.get("small", 0))):
        write_jsonl(folder / f"small-{i:05d}.jsonl", docs, 1)
    for i in range(int(shape.get("zst", 0) // 40)):
        write_jsonl(folder / f"part-{i:05d}.jsonl.zst", docs, 40)
    (folder / "_SUCCESS").write_text("")
    if shape.get("parquet"):
        pq_folder = folder.parent / (folder.name + "-parquet")
        pq_folder.mkdir(exist_ok=True)
        for i in range(4):
            write_parquet(pq_folder / f"part-{i:05d}.parquet", docs, shape["parquet"] / 4)
        (pq_folder / "_SUCCESS").write_text("")


def texts_of(path: Path):
    """What the raw baseline reads: the text of each record (the same parse a user's loader does)."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        f = pq.ParquetFile(path)
        for g in range(f.num_row_groups):
            yield from (t for t in f.read_row_group(g, columns=["text"]).column("text").to_pylist() if t)
        return
    stream = open(path, "rb")  # noqa: SIM115 - closed below
    if path.suffix == ".zst":
        import io

        import zstandard

        stream = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(stream))
    with stream:
        for line in stream:
            try:
                yield json.loads(line)["text"]
            except json.JSONDecodeError:
                continue


def raw_tokens_per_s(folder: Path, tokenizer: str, batch: int = 2048) -> tuple[int, float]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer)
    t0, n, texts = time.perf_counter(), 0, []
    for p in sorted(x for x in folder.iterdir() if not x.name.startswith("_")):
        for text in texts_of(p):
            texts.append(text)
            if len(texts) == batch:
                n += sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False))
                texts = []
    if texts:
        n += sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False))
    return n, time.perf_counter() - t0


class PeakRss(threading.Thread):
    """The largest sum of resident memory of a process and all its descendants, sampled every ``every`` s."""

    def __init__(self, pid: int, every: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.every, self._halt = pid, 0, every, threading.Event()

    def run(self) -> None:
        import psutil

        while not self._halt.wait(self.every):
            try:
                root = psutil.Process(self.pid)
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            total = 0
            for p in procs:
                try:
                    total += p.memory_info().rss
                except psutil.NoSuchProcess:
                    continue
            self.peak = max(self.peak, total)

    def stop(self) -> int:
        self._halt.set()
        self.join()
        return self.peak


def run_stage(folder: Path, workdir: Path, tokenizer: str, bootstrap: str, fmt: str,
              extra: dict | None = None, backend: str = "auto") -> tuple[dict, float, int, str]:
    """``spark-submit`` of the stage with the operator's defaults; ``extra``: more of the corpus's config;
    ``backend``: its ``tokenizer.backend``."""
    from stoker_airflow.operators.publish import default_spark_conf

    corpus = workdir / "bench.yaml"
    corpus.write_text(json.dumps({
        "name": "bench", "source": {"uri": str(folder), "format": fmt},
        "tokenizer": {"path": tokenizer, "backend": backend}, "pack": {"seq_len": 2048}, "topic": {"partitions": 4},
        "publish": {"spark_partitions": 4}, **(extra or {})}))
    conf = default_spark_conf()
    plan = plan_run(corpus, "2026-12-01").write(workdir / f"run-{fmt}" / "plan.json")
    cmd = [str(paths.venv_bin("spark-submit")), "--master", "local[*]",
           *[a for k, v in conf.items() for a in ("--conf", f"{k}={v}")],
           str(paths.project_root() / "spark_jobs" / "tokenize_publish.py"), "--plan", str(plan)]
    env = {**os.environ, "STOKER_KAFKA_CONFIG": json.dumps({"bootstrap.servers": bootstrap}),
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rss = PeakRss(proc.pid)
    rss.start()
    out = proc.communicate()[0]
    seconds, peak = time.perf_counter() - t0, rss.stop()
    if proc.returncode != 0:
        errors = [line for line in out.splitlines() if "Error" in line or "Exception:" in line][:10]
        sys.exit("tokenize_publish failed:\n" + "\n".join(errors) + "\n...\n" + out[-3000:])
    manifest = json.loads(RunLayout(workdir / f"run-{fmt}").manifest.read_text())
    # a GB of records in the broker's log otherwise stays there until its retention (7 days) ends
    ktopics.delete_topics({"bootstrap.servers": bootstrap}, [manifest["topic"], tasks_topic(manifest["topic"])])
    return manifest, seconds, peak, out


def phases(log: str) -> str:
    """Seconds between the job's phase lines (read + dedup, tokenise + publish, up to "done")."""
    marks = [(m.group(1), m.group(2)) for m in re.finditer(
        r"(\d\d:\d\d:\d\d)\S* INFO stoker.tokenize_publish: progress: (done|[a-z ,]+$)", log, re.M)]
    scan = re.search(r"provenance scan: .* in ([\d.]+) s", log)
    parts = [f"provenance scan {scan.group(1)} s"] if scan else []
    for (t1, name), (t2, _) in zip(marks, marks[1:], strict=False):
        a, b = (sum(int(x) * 60 ** i for i, x in enumerate(reversed(t.split(":")))) for t in (t1, t2))
        parts.append(f"{name} {b - a} s")
    verified = re.search(r"by a read_committed read in ([\d.]+) s", log)
    if verified:
        parts.append(f"independent read-back {verified.group(1)} s")
    return "; ".join(parts)


SHAPES = {
    "mixed": {"big": 2200, "small": 200, "zst": 320, "parquet": 300},
    "single": {"big": 300},
}


def report(name: str, folder: Path, workdir: Path, tokenizer: str, bootstrap: str, fmt: str,
           backends: list[str]) -> None:
    """Each backend's whole stage, then the raw side once; every stage must publish the same tokens."""
    files = [p for p in folder.iterdir() if not p.name.startswith("_")]
    mb = sum(p.stat().st_size for p in files) / 1e6
    runs = {b: run_stage(folder, workdir, tokenizer, bootstrap, fmt, backend=b) for b in backends}
    n_raw, raw_s = raw_tokens_per_s(folder, tokenizer)
    raw_tps, largest, m = n_raw / raw_s, max(p.stat().st_size for p in files) / 1e6, runs[backends[0]][0]
    print(f"== {name}: {len(files)} files, {mb:,.0f} MB stored (largest {largest:,.0f} MB), {m['docs_in']:,} records, "
          f"{m['docs_kept']:,} kept, dropped {m['docs_dropped']}; cores: {os.cpu_count()}")
    for b, (m, stage_s, peak, log) in runs.items():
        first = runs[backends[0]][0]
        if (m["tokens"], m["sequences"]) != (first["tokens"], first["sequences"]):
            sys.exit(f"backend {b} published {m['tokens']} tokens in {m['sequences']} sequences, "
                     f"backend {backends[0]} {first['tokens']} in {first['sequences']}")
        spark_tps, ran = (m["tokens"] - m["docs_kept"]) / stage_s, m.get("tokenizer_backend", {})  # without EOS
        print(f"tokenize_publish, backend {b} (ran {ran.get('name', '?')}, {ran.get('checked_in_tasks', 0):,} docs "
              f"checked in tasks): {stage_s:7.1f} s  {spark_tps:12,.0f} tokens/s  ({m['sequences']:,} sequences)  "
              f"peak RSS {peak / 2**30:.2f} GiB  ratio stage / raw {spark_tps / raw_tps:.2f}x")
        print(f"  stage split: {phases(log)}", flush=True)
    print(f"raw tokenizers encode_batch + parse: {raw_s:7.1f} s  {raw_tps:12,.0f} tokens/s", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="mixed")
    ap.add_argument("--big-mb", type=float, help="the big plain file's MB (overrides the shape's)")
    ap.add_argument("--backends", default="auto,tokenizers",
                    help="tokenizer.backend of each stage run, comma-separated (auto: the fast one where proven)")
    args = ap.parse_args()
    shape = dict(SHAPES[args.shape])
    if args.big_mb is not None:
        shape["big"] = args.big_mb
    tokenizer = str(paths.state_dir() / "tokenizers" / "sample-bpe-8192" / "tokenizer.json")
    bootstrap = broker.up().bootstrap
    with tempfile.TemporaryDirectory(dir=paths.state_dir()) as tmp:
        folder = Path(tmp) / "night"
        t0 = time.perf_counter()
        make_corpus(folder, shape)
        print(f"corpus {shape} made in {time.perf_counter() - t0:.0f} s", flush=True)
        backends = args.backends.split(",")
        report("JSONL (plain and .zst)", folder, Path(tmp), tokenizer, bootstrap, "jsonl", backends)
        if shape.get("parquet"):
            report("Parquet", folder.parent / "night-parquet", Path(tmp), tokenizer, bootstrap, "parquet", backends)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
