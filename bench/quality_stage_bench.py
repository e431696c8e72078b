"""The whole Spark stage with the quality filters and near-dedup, against datatrove's ``LocalPipelineExecutor``
running the same filters, near-dedup and tokenisation on the same files and cores: documents a second per core,
and the peak memory of each.

    .stoker/venv/bin/python bench/quality_stage_bench.py [--docs 20000]   (make bench-quality; in make bench)

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
The memory is the largest sum of resident memory of each side's process tree, sampled twice a second. Results go
to ``.stoker/bench/quality_stage.jsonl``.
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
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

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
    from quality_oracle import ALL_ON, minhash_signature, oracle_steps

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


def main(argv: list[str] | None = None) -> int:
    from scale_bench import PeakRss, phases, run_stage

    from stoker import paths
    from stoker_local import broker

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=20_000)
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
    with tempfile.TemporaryDirectory(dir=paths.state_dir()) as tmp:
        folder, n = Path(tmp) / "night", write_night(Path(tmp) / "night", args.docs)
        quality = {**_web_quality(), "near_dedup": {**_web_quality().get("near_dedup", {}), "enabled": True,
                                                    "index": str(Path(tmp) / "index")}}
        m, stoker_s, stoker_peak, log = run_stage(folder, Path(tmp), tokenizer, bootstrap, "jsonl",
                                                {"quality": quality})
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, __file__, "--datatrove-only", str(folder), str(Path(tmp) / "dt"),
                                 tokenizer], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path[:3])})
        rss = PeakRss(proc.pid)
        rss.start()
        err = proc.communicate()[1]
        dt_s, dt_peak = time.perf_counter() - t0, rss.stop()
        if proc.returncode != 0:
            sys.exit("datatrove's pipeline failed:\n" + err[-3000:])
        dt_kept = _kept_by_datatrove(Path(tmp) / "dt")
    row = {"docs": n, "cores": cores, "stoker_s": stoker_s, "stoker_kept": m["docs_kept"],
           "stoker_docs_s_core": n / stoker_s / cores, "stoker_peak_gib": stoker_peak / 2**30,
           "datatrove_s": dt_s, "datatrove_kept": dt_kept, "datatrove_docs_s_core": n / dt_s / cores,
           "datatrove_peak_gib": dt_peak / 2**30, "dropped": m["docs_dropped"]}
    with out.open("a") as f:
        f.write(json.dumps({**row, "at": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")
    print(json.dumps(row))
    print(f"\n| side | seconds | kept | docs/s per core | peak memory |\n|---|---|---|---|---|\n"
          f"| Stoker (spark-submit, local[{cores}]) | {stoker_s:.1f} | {m['docs_kept']:,} | "
          f"{row['stoker_docs_s_core']:,.0f} | {row['stoker_peak_gib']:.2f} GiB |\n"
          f"| datatrove LocalPipelineExecutor ({cores} workers) | {dt_s:.1f} | {dt_kept:,} | "
          f"{row['datatrove_docs_s_core']:,.0f} | {row['datatrove_peak_gib']:.2f} GiB |\n"
          f"ratio Stoker / datatrove: {dt_s / stoker_s:.2f}x\nStoker's stage split: {phases(log)}")
    return 0


def _web_quality() -> dict:
    """The quality block of corpora/examples/web_quality.yaml (every filter on)."""
    import yaml

    return yaml.safe_load((REPO / "corpora" / "examples" / "web_quality.yaml").read_text())["quality"]


if __name__ == "__main__":
    raise SystemExit(main())
