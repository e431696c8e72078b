"""The quality filters against datatrove on the same documents, one core: agreement and speed.

    .stoker/venv/bin/python bench/quality_bench.py [--docs 10000]      (make bench-quality; in make bench)

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
import sys
import time
import unicodedata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

CASES = {
    "gopher_repetition": {"gopher_repetition": {"enabled": True}},
    "gopher_quality": {"gopher_quality": {"enabled": True}},
    "c4": {"c4": {"enabled": True}},
    "fineweb": {"fineweb": {"enabled": True}},
}


def main(argv: list[str] | None = None) -> int:
    from quality_oracle import ALL_ON, oracle_chain, quality

    from spark_jobs.quality import Filters
    from stoker_local.mixed_sample import documents

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
    print("\n| filter | documents | kept | same decision and reason | Stoker docs/s | datatrove docs/s | ratio |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['docs']:,} | {r['kept']:,} | {100 * r['agree']:.2f}% | {r['stoker_docs_s']:,.0f} "
              f"| {r['datatrove_docs_s']:,.0f} | {r['stoker_docs_s'] / r['datatrove_docs_s']:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
