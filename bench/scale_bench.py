"""The Spark stage at real sizes: one big JSONL shard through tokenize_publish at the default settings,
next to raw ``tokenizers`` encode_batch with JSON parsing on the same file and cores.

    .stoker/venv/bin/python bench/scale_bench.py [--mb 300] [--files 1]

Makes a deterministic corpus (``--files`` JSONL files of ``--mb`` MB in all; every document distinct,
from the sample corpus's texts with a counter), runs ``spark-submit spark_jobs/tokenize_publish.py``
with the operator's default Spark settings against the embedded broker, and samples the resident
memory of every process of that run (JVM, Python workers) twice a second. The raw side reads the same
files line by line in one process, ``json.loads`` each line and tokenises with ``encode_batch`` (its own
thread pool over every core). Prints tokens/s of each, their ratio, the peak memory, and how the
stage's time split (from its progress lines). Needs `make setup`; the broker is started if needed.
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
from stoker.layout import RunLayout
from stoker.local import broker, sample


def make_corpus(folder: Path, mb: int, files: int) -> int:
    """Distinct documents (a counter keeps dedup from dropping repeats) up to ``mb`` MB."""
    texts = list(sample.texts(paths.state_dir() / "data" / "sample"))
    folder.mkdir(parents=True, exist_ok=True)
    per_file, n = mb * 1_000_000 // files, 0
    for f in range(files):
        size = 0
        with open(folder / f"shard-{f:05d}.jsonl", "wb") as out:
            while size < per_file:
                line = json.dumps({"id": n, "text": f"{texts[n % len(texts)]}\n[{n}]"}).encode() + b"\n"
                out.write(line)
                size += len(line)
                n += 1
    (folder / "_SUCCESS").write_text("")
    return n


def raw_tokens_per_s(folder: Path, tokenizer: str, batch: int = 2048) -> tuple[int, float]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer)
    t0, n, texts = time.perf_counter(), 0, []
    for p in sorted(folder.glob("*.jsonl")):
        with open(p, "rb") as f:
            for line in f:
                texts.append(json.loads(line)["text"])
                if len(texts) == batch:
                    n += sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False))
                    texts = []
    if texts:
        n += sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False))
    return n, time.perf_counter() - t0


class PeakRss(threading.Thread):
    """The largest sum of resident memory of a process and all its descendants, sampled every 0.5 s."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self._halt = pid, 0, threading.Event()

    def run(self) -> None:
        import psutil

        while not self._halt.wait(0.5):
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


def run_stage(folder: Path, workdir: Path, tokenizer: str, bootstrap: str) -> tuple[dict, float, int, str]:
    from stoker_airflow.operators import default_spark_conf

    corpus = workdir / "bench.yaml"
    corpus.write_text(json.dumps({
        "name": "bench", "source": {"uri": str(folder), "format": "jsonl"},
        "tokenizer": {"path": tokenizer}, "pack": {"seq_len": 2048}, "topic": {"partitions": 4},
        "publish": {"spark_partitions": 4}}))
    conf = default_spark_conf()
    cmd = [str(paths.venv_bin("spark-submit")), "--master", "local[*]",
           *[a for k, v in conf.items() for a in ("--conf", f"{k}={v}")],
           str(paths.project_root() / "spark_jobs" / "tokenize_publish.py"), "--corpus", str(corpus),
           "--ds", "2026-12-01", "--topic", f"stoker.bench.{time.time_ns()}.a1", "--run-dir", str(workdir / "run")]
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
    manifest = json.loads(RunLayout(workdir / "run").manifest.read_text())
    return manifest, seconds, peak, out


def phases(log: str) -> str:
    """Seconds between the job's phase lines (read + dedup, tokenise + publish, up to "done")."""
    marks = [(m.group(1), m.group(2)) for m in re.finditer(
        r"(\d\d:\d\d:\d\d)\S* INFO stoker.tokenize_publish: progress: (done|[a-z ,]+$)", log, re.M)]
    scan = re.search(r"lineage scan: .* in ([\d.]+) s", log)
    parts = [f"lineage scan {scan.group(1)} s"] if scan else []
    for (t1, name), (t2, _) in zip(marks, marks[1:], strict=False):
        a, b = (sum(int(x) * 60 ** i for i, x in enumerate(reversed(t.split(":")))) for t in (t1, t2))
        parts.append(f"{name} {b - a} s")
    return "; ".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=300)
    ap.add_argument("--files", type=int, default=1)
    args = ap.parse_args()
    tokenizer = str(paths.state_dir() / "tokenizers" / "sample-bpe-8192" / "tokenizer.json")
    bootstrap = broker.up().bootstrap
    with tempfile.TemporaryDirectory(dir=paths.state_dir()) as tmp:
        folder = Path(tmp) / "night"
        docs = make_corpus(folder, args.mb, args.files)
        mb = sum(p.stat().st_size for p in folder.glob("*.jsonl")) / 1e6
        m, stage_s, peak, log = run_stage(folder, Path(tmp), tokenizer, bootstrap)
        n_raw, raw_s = raw_tokens_per_s(folder, tokenizer)
    spark_tps, raw_tps = (m["tokens"] - m["docs_kept"]) / stage_s, n_raw / raw_s  # without the EOS per doc
    print(f"corpus: {args.files} file(s), {mb:.0f} MB, {docs} documents; cores: {os.cpu_count()}")
    print(f"tokenize_publish (spark-submit, defaults): {stage_s:7.1f} s  {spark_tps:12,.0f} tokens/s  "
          f"({m['docs_kept']} docs kept, {m['sequences']} sequences)  peak RSS {peak / 2**30:.2f} GiB")
    print(f"raw encode_batch + json.loads            : {raw_s:7.1f} s  {raw_tps:12,.0f} tokens/s")
    print(f"ratio stage / raw                        : {spark_tps / raw_tps:.2f}x")
    print(f"stage split: {phases(log)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
