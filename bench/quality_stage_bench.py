"""The whole Spark stage with the quality filters and near-dedup, against datatrove's ``LocalPipelineExecutor``
running the same filters, near-dedup and tokenisation on the same files and cores: documents a second per core,
and the peak memory of each.

    .stoker/venv/bin/python -m bench.quality_stage_bench [--docs 20000]   (make bench-quality; in make bench)

The night: ``stoker_local.mixed_sample`` documents in 4 JSONL files.
* Stoker: ``spark-submit spark_jobs/tokenize_publish.py`` with the operator's default Spark settings
  (``local[*]``), every filter of ``corpora/examples/web_quality.yaml`` on (language ID, Gopher repetition and
  quality, C4, FineWeb, e-mail/IP scrubbing) and near-dedup (FineWeb's 5-grams, 14 x 8) against an empty index;
  it reads, filters, deduplicates exactly and nearly, quarantines, tokenises, packs and publishes to the
  embedded broker with its read-back check.
* datatrove 0.10.1, as FineWeb's own scripts run it: the filters with an exclusion writer each (its quarantine),
  the kept documents written, MinHash signatures, buckets, clusters, the filter of the duplicates and its
  ``DocumentTokenizer`` (tokenised token files, as its pipelines feed training) with the same tokenizer; one task
  a file, as many workers as cores. No exact dedup (FineWeb runs none at this point).
Each side runs ``--rounds`` times, alternating, and its best time counts. The memory is the largest sum of
resident memory of each side's process tree, sampled twice a second, over every round. Results go to
``.stoker/bench/quality_stage.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

FILES = 4
EOS = "<|endoftext|>"


def write_night(folder: Path, n: int) -> int:
    from stoker_local.mixed_sample import documents

    docs = [json.dumps({"text": text, "id": f"d{i}"}) for i, (_, text) in enumerate(documents(n, seed=21))]
    folder.mkdir(parents=True)
    per = -(-len(docs) // FILES)
    for f in range(FILES):
        (folder / f"part-{f:05d}.jsonl").write_text("\n".join(docs[f * per:(f + 1) * per]) + "\n")
    (folder / "_SUCCESS").write_text("")
    return len(docs)


def datatrove_side(folder: Path, work: Path, tokenizer: str, cores: int) -> None:
    """FineWeb's pipeline shape on ``folder``: filter → signatures → buckets → clusters → dedup + tokenise."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup import (
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
    )
    from datatrove.pipeline.dedup.minhash import MinhashConfig
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.tokens import DocumentTokenizer
    from datatrove.pipeline.writers import JsonlWriter

    from tests.support.quality_oracle import ALL_ON, minhash_signature, oracle_steps

    filters, pii = oracle_steps(ALL_ON)
    for f in filters:
        f.exclusion_writer = JsonlWriter(str(work / "removed" / f.name.replace(" ", "_")))
    mh = MinhashConfig()  # FineWeb's: 5-grams, 14 buckets of 8

    def run(pipeline: list, tasks: int) -> None:
        LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=min(tasks, cores),
                              logging_dir=str(work / "logs" / str(time.monotonic_ns()))).run()

    run([JsonlReader(str(folder), glob_pattern="*.jsonl"), *filters, pii, JsonlWriter(str(work / "filtered")),
         minhash_signature(str(work / "sigs"))], FILES)
    run([MinhashDedupBuckets(input_folder=str(work / "sigs"), output_folder=str(work / "buckets"), config=mh)],
        mh.num_buckets)
    run([MinhashDedupCluster(input_folder=str(work / "buckets"), output_folder=str(work / "remove_ids"), config=mh)],
        1)
    run([JsonlReader(str(work / "filtered")),
         MinhashDedupFilter(input_folder=str(work / "remove_ids"),
                            exclusion_writer=JsonlWriter(str(work / "removed" / "minhash"))),
         DocumentTokenizer(output_folder=str(work / "tokens"), tokenizer_name_or_path=tokenizer, eos_token=EOS)],
        FILES)


def _kept_by_datatrove(work: Path) -> int:
    import gzip

    return sum(1 for p in (work / "filtered").glob("*.jsonl.gz") for _ in gzip.open(p)) - sum(
        1 for p in (work / "removed" / "minhash").glob("*.jsonl.gz") for _ in gzip.open(p))


def run_datatrove(folder: Path, work: Path, tokenizer: str) -> tuple[float, int, int]:
    """datatrove's side in a process of its own: seconds, peak memory, documents kept."""
    from bench.scale_bench import PeakRss

    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "bench.quality_stage_bench", "--datatrove-only", str(folder),
                             str(work), tokenizer], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            cwd=REPO)
    rss = PeakRss(proc.pid)
    rss.start()
    err = proc.communicate()[1]
    seconds, peak = time.perf_counter() - t0, rss.stop()
    if proc.returncode != 0:
        sys.exit("datatrove's pipeline failed:\n" + err[-3000:])
    return seconds, peak, _kept_by_datatrove(work)


def main(argv: list[str] | None = None) -> int:
    from bench.scale_bench import phases, run_stage
    from stoker import paths
    from stoker_local import broker

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=2, help="each side this many times, alternating; the best counts")
    ap.add_argument("--datatrove-only", nargs=3, metavar=("FOLDER", "WORK", "TOKENIZER"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    cores = os.cpu_count() or 1
    if args.datatrove_only:
        folder, work, tok = args.datatrove_only
        datatrove_side(Path(folder), Path(work), tok, cores)
        return 0
    tokenizer = str(paths.state_dir() / "tokenizers" / "sample-bpe-8192" / "tokenizer.json")
    bootstrap = broker.up().bootstrap
    out = REPO / ".stoker" / "bench" / "quality_stage.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    stoker, datatrove = [], []
    with tempfile.TemporaryDirectory(dir=paths.state_dir()) as tmp:
        folder, n = Path(tmp) / "night", write_night(Path(tmp) / "night", args.docs)
        for r in range(args.rounds):
            work = Path(tmp) / f"round-{r}"
            work.mkdir()
            quality = {**_web_quality(), "near_dedup": {"enabled": True, "index": str(work / "index")}}
            m, seconds, peak, log = run_stage(folder, work, tokenizer, bootstrap, "jsonl", {"quality": quality})
            stoker.append((seconds, peak, m["docs_kept"], phases(log)))
            datatrove.append(run_datatrove(folder, work / "dt", tokenizer))
            print(f"round {r}: Stoker {seconds:.1f} s, datatrove {datatrove[-1][0]:.1f} s", flush=True)
    (s_s, _, s_kept, split), (d_s, _, d_kept) = min(stoker), min(datatrove)
    row = {"docs": n, "cores": cores, "rounds": args.rounds, "stoker_s": s_s, "stoker_kept": s_kept,
           "stoker_docs_s_core": n / s_s / cores, "stoker_peak_gib": max(x[1] for x in stoker) / 2**30,
           "datatrove_s": d_s, "datatrove_kept": d_kept, "datatrove_docs_s_core": n / d_s / cores,
           "datatrove_peak_gib": max(x[1] for x in datatrove) / 2**30, "dropped": m["docs_dropped"]}
    with out.open("a") as f:
        f.write(json.dumps({**row, "at": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")
    print(json.dumps(row))
    print(f"\n| side | seconds (best of {args.rounds}) | kept | docs/s per core | peak memory |\n"
          "|---|---|---|---|---|\n"
          f"| Stoker (spark-submit, local[{cores}]) | {s_s:.1f} | {s_kept:,} | {row['stoker_docs_s_core']:,.0f} | "
          f"{row['stoker_peak_gib']:.2f} GiB |\n"
          f"| datatrove LocalPipelineExecutor ({cores} workers) | {d_s:.1f} | {d_kept:,} | "
          f"{row['datatrove_docs_s_core']:,.0f} | {row['datatrove_peak_gib']:.2f} GiB |\n"
          f"ratio Stoker / datatrove: {d_s / s_s:.2f}x\nStoker's stage split: {split}")
    return 0


def _web_quality() -> dict:
    """The quality block of corpora/examples/web_quality.yaml (every filter on)."""
    import yaml

    return yaml.safe_load((REPO / "corpora" / "examples" / "web_quality.yaml").read_text())["quality"]


if __name__ == "__main__":
    raise SystemExit(main())
