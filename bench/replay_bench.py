"""Forgetting with and without replay (``train.replay`` 0, 0.05, 0.25): two nights of one line through the DAG
(``dag.test()``), with a deliberate shift between them, on the same data for every share.

    .stoker/venv/bin/python -m bench.replay_bench          (make bench-replay; in make bench)

Night 1 is the sample's shard part-00002 (English docstrings); night 2 is text in another script (sentences
of CJK ideographs with a Zipfian character distribution), a shift the model must learn without losing night 1.
(Python source code as night 2 was tried first: with no replay night 1's held-out figure went down, 2.335 ->
2.247 bits per byte: the small model was still learning what code and docstrings share, so nothing was
forgotten to measure.) The recipe is debug_cpu with one warm-up step, the default schedule (wsd), 20 documents a
thousand held out. For each share: bits per byte on night 1's held-out documents after night 1 and after
night 2 (its rise is what night 2 cost night 1), and night 2's own held-out figure. In the suite's
environment, in a state folder of its own (``.stoker/bench-home``); results in ``.stoker/bench/replay.jsonl``,
the table at the end is what BENCHMARKS.md records.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ["STOKER_TEST_HOME"] = str(REPO / ".stoker" / "bench-home")  # read by the suite's conftest

SHARES = (0.0, 0.05, 0.25)
FIRST, SECOND = "2026-11-24", "2026-11-25"
SHIFT_DOCS = 300


def shift_drop(folder: Path, docs: int = SHIFT_DOCS) -> None:
    """Night 2's drop: text in another script. Sentences of CJK ideographs drawn with Zipf's law from 3,000 of
    them (a language's skewed character use, learnable), about 500 characters a document; the sample's
    tokenizer, trained on English, spells each ideograph in its byte tokens."""
    folder.mkdir(parents=True)
    rng = random.Random(11)
    chars = [chr(0x4E00 + i) for i in rng.sample(range(0x5000), 3000)]
    weights = [1.0 / (rank + 1) for rank in range(len(chars))]
    out = []
    for _ in range(docs):
        sentences = ["".join(rng.choices(chars, weights, k=rng.randint(8, 30))) + rng.choice("。，！？")
                     for _ in range(rng.randint(15, 35))]
        out.append("".join(sentences))
    (folder / "part-00000.jsonl").write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in out))
    (folder / "_SUCCESS").write_text("")


def line_of(share: float, root: Path, sample_data: Path) -> list[dict]:
    from stoker.layout import LineLayout, RunLayout
    from tests.support import sabotage as ts

    shutil.rmtree(LineLayout.of(ts.CORPUS).folder, ignore_errors=True)
    for ds in (FIRST, SECOND):
        shutil.rmtree(RunLayout.of(ts.CORPUS, ds).run_dir, ignore_errors=True)
    corpora = ts.sabotage_corpora(root, sample_data, {FIRST: ("part-00002.jsonl", None)})
    shift_drop(root / "drops" / SECOND)
    config = corpora / f"{ts.CORPUS}.yaml"
    config.write_text(config.read_text().replace("train:\n", f"train:\n  replay: {share}\n", 1))
    t0 = time.monotonic()
    one = ts.run_night(corpora, FIRST, review="promote")["eval"]["sets"]
    two = ts.run_night(corpora, SECOND, review="promote")
    sets, replayed = two["eval"]["sets"], (two.get("training") or {}).get("sequences_replayed") or 0
    row = {"replay": share, "first_after_1": one["night"]["all"]["bpb"],
           "first_after_2": sets[f"forgetting:{FIRST}.{ts.CORPUS}"]["all"]["bpb"], "own_2": sets["night"]["all"]["bpb"],
           "replayed": replayed, "sequences_2": two["training"]["sequences_consumed"],
           "seconds": round(time.monotonic() - t0, 1)}
    row["rise"] = row["first_after_2"] - row["first_after_1"]
    print(json.dumps(row), flush=True)
    return [row]


def main() -> None:
    from bench.sabotage_bench import each_variant

    rows = each_variant("replay.jsonl", SHARES, line_of)
    base = rows[0]
    print("\n| train.replay | replayed / night 2's own | night 1 held-out after night 1 | after night 2 | rise | "
          "rise vs no replay | night 2's own held-out | vs no replay | seconds |\n" + "|---" * 9 + "|")
    for r in rows:
        print(f"| {r['replay']} | {r['replayed']} / {r['sequences_2']} | {r['first_after_1']:.4f} | "
              f"{r['first_after_2']:.4f} | {r['rise']:+.4f} | {r['rise'] / base['rise']:.2f}x | {r['own_2']:.4f} | "
              f"{100 * (r['own_2'] / base['own_2'] - 1):+.1f}% | {r['seconds']:.0f} |")


if __name__ == "__main__":
    main()
