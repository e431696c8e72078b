"""The quality filters against datatrove on the same documents, one core: agreement and speed.

    .stoker/venv/bin/python -m bench.quality_bench [--docs 10000]      (make bench-quality; in make bench)

The documents are ``stoker_local.mixed_sample`` (English prose, web-like pages, code, CJK, boilerplate,
repetition, personal data, lorem ipsum, degenerate records), NFC-normalised and stripped as the Spark stage
hands them to the filters. For each filter alone and for FineWeb's chain with e-mail/IP scrubbing:

* agreement: the share of documents where Stoker and datatrove make the same keep/drop decision, with the same
  reason where both drop (and the same kept text, C4 removing lines and scrubbing replacing addresses);
* speed: documents a second through each, interleaved in rounds on the same core (datatrove's filter classes
  called directly, without its executor's reading and writing, so the figure is the filters' own work).

Results go to ``.stoker/bench/quality.jsonl``; the table at the end is what BENCHMARKS.md records.
"""

from __future__ import annotations

import argparse
import json
import time
import unicodedata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CASES = {
    "gopher_repetition": {"gopher_repetition": {"enabled": True}},
    "gopher_quality": {"gopher_quality": {"enabled": True}},
    "c4": {"c4": {"enabled": True}},
    "fineweb": {"fineweb": {"enabled": True}},
}


def main(argv: list[str] | None = None) -> int:
    from spark_jobs.quality import Filters
    from stoker_local.mixed_sample import documents
    from tests.support.quality_oracle import ALL_ON, oracle_chain, quality

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    docs = [t for t in (unicodedata.normalize("NFC", text).strip() for _, text in documents(args.docs, seed=11)) if t]
    out = REPO / ".stoker" / "bench" / "quality.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, block in {**CASES, "fineweb chain + pii": ALL_ON}.items():
        mine, theirs = Filters(quality(block)), oracle_chain(block)
        same, kept = 0, 0
        for i, text in enumerate(docs):
            v = mine.apply(text)
            same += (v.text, v.reason) == theirs(i, text)
            kept += v.text is not None
        t_mine = t_theirs = 0.0
        for _ in range(args.rounds):  # interleaved, so both see the same machine
            t0 = time.perf_counter()
            for text in docs:
                mine.apply(text)
            t1 = time.perf_counter()
            for i, text in enumerate(docs):
                theirs(i, text)
            t_mine, t_theirs = t_mine + t1 - t0, t_theirs + time.perf_counter() - t1
        n = args.rounds * len(docs)
        row = {"case": name, "docs": len(docs), "kept": kept, "agree": same / len(docs),
               "stoker_docs_s": n / t_mine, "datatrove_docs_s": n / t_theirs}
        rows.append(row)
        with out.open("a") as f:
            f.write(json.dumps({**row, "at": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")
        print(json.dumps(row), flush=True)
    near_dup_recall(docs, out)
    print("\n| filter | documents | kept | same decision and reason | Stoker docs/s | datatrove docs/s | ratio |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['docs']:,} | {r['kept']:,} | {100 * r['agree']:.2f}% | {r['stoker_docs_s']:,.0f} "
              f"| {r['datatrove_docs_s']:,.0f} | {r['stoker_docs_s'] / r['datatrove_docs_s']:.2f}x |")
    return 0


SHAPES = {
    "fineweb (word 5-grams, 14 x 8)": {},
    "curator (24-char shingles, 20 x 13)": {"shingle": "chars", "n_grams": 24, "bands": 20, "hashes_per_band": 13},
    "word 5-grams, 20 x 5": {"bands": 20, "hashes_per_band": 5},
}


def _edit(rng, text: str, share: float) -> str:
    """``share`` of the words replaced, in one to three places (changed sentences, a new date, a footer)."""
    words = text.split()
    for _ in range(places := rng.randint(1, 3)):
        span = max(1, int(len(words) * share / places))
        start = rng.randrange(max(1, len(words) - span))
        words[start:start + span] = ["".join(rng.choices("qxzjkv", k=5)) for _ in range(span)]
    return " ".join(words)


def _disjoint(candidates: list[str], night1: list[str], n: int) -> list[str]:
    """Up to ``n`` documents whose word 5-gram sets overlap every night-1 document's by a Jaccard below 0.3: no
    near-duplicate of any (the mixed sample's pages share docstrings, so some of its documents are)."""
    from spark_jobs.quality import minhasher_for
    from tests.support.quality_oracle import quality

    h = minhasher_for(quality({"near_dedup": {"enabled": True}}))
    sets = [set(h.shingles(t).reshape(-1).tolist()) for t in night1]
    out = []
    for t in candidates:
        mine = set(h.shingles(t).reshape(-1).tolist())
        if mine and all(len(mine & s) / len(mine | s) < 0.3 for s in sets if s):
            out.append(t)
            if len(out) == n:
                break
    return out


def near_dup_recall(docs: list[str], out: Path, copies: int = 200) -> None:
    """Issue 23's recall case: ``copies`` near-duplicates (5-15% of the words edited) of night-1 documents in
    night 2, beside a disjoint control set; caught = shares a band with its original; false = a control
    document that shares a band with any night-1 document."""
    import random

    from spark_jobs.quality import minhasher_for
    from tests.support.quality_oracle import quality

    rng = random.Random(3)
    long = list(dict.fromkeys(t for t in docs if len(t.split()) >= 100))
    rng.shuffle(long)
    night1 = long[:copies]
    control = _disjoint(long[copies:], night1, 1000)
    pairs = [(_edit(rng, t, rng.uniform(0.05, 0.15)), t) for t in night1]
    print(f"\nnear-dup recall: {len(pairs)} edited copies of night-1 documents, {len(control)} control documents")
    print("| shape | caught | false drops among controls |\n|---|---|---|")
    for name, block in SHAPES.items():
        h = minhasher_for(quality({"near_dedup": {"enabled": True, **block}}))
        index = {(b, k) for t in night1 for b, k in enumerate(h.bands(t) or [])}
        caught = sum(any((b, k) in index for b, k in enumerate(h.bands(c) or [])) for c, _ in pairs)
        false = sum(any((b, k) in index for b, k in enumerate(h.bands(c) or [])) for c in control)
        row = {"case": f"near-dup {name}", "copies": len(pairs), "caught": caught, "controls": len(control),
               "false": false}
        with out.open("a") as f:
            f.write(json.dumps({**row, "at": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")
        print(f"| {name} | {caught} of {len(pairs)} ({100 * caught / len(pairs):.1f}%) | {false} of {len(control)} |")
    index_size(docs, out)


def index_size(docs: list[str], out: Path) -> None:
    """Bytes a document of the near-dedup index takes: the night's folder as the job writes it (Parquet,
    source file, position, 14 band keys), for the documents with a signature."""
    import tempfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    from spark_jobs.quality import minhasher_for
    from tests.support.quality_oracle import quality

    h = minhasher_for(quality({"near_dedup": {"enabled": True}}))
    bands = [b for b in (h.bands(t) for t in docs) if b is not None]
    sources = [f"s3://bucket/crawl/2026-12-01/part-{i // 5000:05d}.jsonl.zst" for i in range(len(bands))]
    table = pa.table({"source": sources, "pos": [i * 2900 for i in range(len(bands))], "bands": bands},
                     schema=pa.schema([("source", pa.string()), ("pos", pa.int64()), ("bands", pa.list_(pa.int64()))]))
    with tempfile.TemporaryDirectory() as tmp:
        pq.write_table(table, f"{tmp}/part.parquet")  # Spark's writer: snappy, dictionary-encoded strings
        size = Path(f"{tmp}/part.parquet").stat().st_size
    row = {"case": "near-dup index", "docs": len(bands), "bytes": size, "bytes_per_doc": size / len(bands)}
    with out.open("a") as f:
        f.write(json.dumps({**row, "at": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")
    print(f"\nnear-dup index: {len(bands):,} documents, {size:,} bytes, {size / len(bands):.0f} bytes a document; "
          f"100 M documents: {size / len(bands) * 1e8 / 1e9:.1f} GB")


if __name__ == "__main__":
    raise SystemExit(main())
