"""Trials of the promotion gate against sabotaged nights, through the DAG (``dag.test()``), as
tests/e2e/test_sabotage.py runs one:

    .stoker/venv/bin/python -m bench.sabotage_bench [--trials 10]          (make bench-gate)

Each trial is a line of its own. It starts from a model pre-trained (80 plain-torch steps, as the stack test's
line ``gated`` starts) on a shard the trial's nights do not read, since a line is continued from a trained model
in use: on a line from random weights, 100 x the learning rate on a young model still lowered its loss in 2 of
10 trials (``--start random`` runs that shape). Then a clean first night on one shard of the sample, and from it
* ``clean``: another shard, clean: must be promoted;
* ``scrambled``: a shard with every document's characters shuffled: must be held;
* ``shuffled_words``: a shard with every document's words shuffled: measured (on a line this young it is no
  sure sabotage: the model still learns mostly which tokens are frequent);
* ``lr_x100``: a clean shard at 100 x the recipe's learning rate: must be held.
Trials differ in the shards and the recipe's seed (the model's init). A held night is never continued: each
later night of a trial continues the newest promoted one: the clean night runs before the shuffled words.
The suite's environment (its Airflow home and broker port) in a state folder of its own,
``.stoker/bench-home``. Results go to ``.stoker/bench/sabotage.jsonl``; the table at the end is what
BENCHMARKS.md records.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
os.environ["STOKER_TEST_HOME"] = str(REPO / ".stoker" / "bench-home")  # read by the suite's conftest

SHARDS = ("part-00000.jsonl", "part-00001.jsonl", "part-00002.jsonl", "part-00003.jsonl")
EXPECTED = {"first": "promoted", "clean": "promoted", "scrambled": "held", "lr_x100": "held"}
KINDS = ("first", "scrambled", "lr_x100", "clean", "shuffled_words")  # the clean night continues the first


def trial(i: int, root: Path, sample_data: Path, start: str = "pretrained", offset: int = 0) -> list[dict]:
    from stoker.layout import LineLayout, RunLayout
    from tests.support import sabotage as ts
    from tests.support.trainer_tools import pretrain_deepseek

    day0 = date(2026, 11, 15) + timedelta(days=len(KINDS) * i)  # after the corpus's schedule.start_date
    days = {k: (day0 + timedelta(days=d)).isoformat() for d, k in enumerate(KINDS)}
    pick = [SHARDS[(i + offset + j) % len(SHARDS)] for j in range(3)]
    nights = {days["first"]: (pick[0], None), days["scrambled"]: (pick[1], "chars"),
              days["shuffled_words"]: (pick[1], "words"), days["lr_x100"]: (pick[2], None),
              days["clean"]: (pick[1], None)}
    shutil.rmtree(LineLayout.of(ts.CORPUS).folder, ignore_errors=True)
    for ds in days.values():
        shutil.rmtree(RunLayout.of(ts.CORPUS, ds).run_dir, ignore_errors=True)
    corpora = ts.sabotage_corpora(root / f"t{i}", sample_data, nights)
    if start == "pretrained":  # on the shard none of the trial's nights reads
        model, spare = root / f"t{i}" / "start", SHARDS[(i + offset + 3) % len(SHARDS)]
        docs = [t for t in map(_text, (sample_data / spare).read_bytes().splitlines()) if t][:400]
        pretrain_deepseek(Path(os.environ["STOKER_HOME"]) / "tokenizers" / "sample-bpe-8192" / "tokenizer.json",
                          docs, model, 256, steps=80)
        corpus = corpora / f"{ts.CORPUS}.yaml"
        text = corpus.read_text()
        assert f"  recipe: {ts.CORPUS}\n" in text
        corpus.write_text(text.replace(f"  recipe: {ts.CORPUS}\n", f'  recipe: {ts.CORPUS}\n  init: "{model}"\n'))
    recipe = corpora / "recipes" / f"{ts.CORPUS}.yaml"
    base = ts.RECIPE + f"seed: {1000 + offset + i}\n"
    recipe.write_text(base)
    out = []
    for kind in KINDS:
        recipe.write_text(base + ("lr: 0.1\n" if kind == "lr_x100" else ""))
        t0 = time.monotonic()
        summary = ts.run_night(corpora, days[kind])
        ev = summary["eval"]
        worst = max((r for r in ev["decision"].get("regressions", [])), key=lambda r: r["change"], default=None)
        out.append({"trial": offset + i, "start": start, "kind": kind, "decision": ev["decision"]["decision"],
                    "changes": {name: figures["all"].get("delta") for name, figures in ev["sets"].items()},
                    "worst": worst and {k: worst[k] for k in ("set", "change", "allowed")},
                    "seconds": round(time.monotonic() - t0, 1)})
        print(json.dumps(out[-1]), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--start", choices=("pretrained", "random"), default="pretrained",
                    help="each trial's line starts from a pre-trained model (default) or from random weights")
    ap.add_argument("--seed-offset", type=int, default=0,
                    help="a fresh set of trials: other recipe seeds and another order of the shards")
    args = ap.parse_args()

    results_file = REPO / ".stoker" / "bench" / "sabotage.jsonl"
    results_file.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    with environment() as (home, data), tempfile.TemporaryDirectory(dir=home) as tmp:
        for i in range(args.trials):
            rows += trial(i, Path(tmp), data, args.start, args.seed_offset)
            with results_file.open("a") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows if r["trial"] == args.seed_offset + i)
    print("\n| night | trials | decisions | as expected | change on its own set (mean) | change on the first "
          "night's (mean) | seconds (mean) |\n|---|---|---|---|---|---|---|")
    for kind in KINDS:
        got = [r for r in rows if r["kind"] == kind]
        ok = f"{Counter(r['decision'] == EXPECTED[kind] for r in got)[True]}/{len(got)}" if kind in EXPECTED else "-"
        seen = ", ".join(f"{d} {n}" for d, n in sorted(Counter(r["decision"] for r in got).items()))
        own = _mean([r["changes"].get("night") for r in got])
        first = _mean([r["changes"][min(k for k in r["changes"] if k.startswith("forgetting:"))] for r in got
                       if any(k.startswith("forgetting:") for k in r["changes"])])  # the earliest: the first night
        print(f"| {kind} | {len(got)} | {seen} | {ok} | {own:+.3f} | {first:+.3f} | "
              f"{_mean([r['seconds'] for r in got]):.0f} |")


@contextlib.contextmanager
def environment() -> Iterator[tuple[Path, Path]]:
    """The suite's environment (its Airflow home, its broker port, or the broker ``STOKER_KAFKA_BOOTSTRAP`` names)
    in the bench's state folder, with the sample corpus and tokenizer: (home, the sample's data folder)."""
    import subprocess

    from stoker_local import broker as stack
    from stoker_local import sample
    from tests.conftest import TEST_KAFKA_PORT

    home = Path(os.environ["STOKER_HOME"])
    data, tok = home / "data" / "sample", home / "tokenizers" / "sample-bpe-8192"
    if not (data / "_SUCCESS").exists():
        sample.write_corpus(data)
        sample.train_tokenizer(data, tok)
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, stdout=subprocess.DEVNULL)
    if os.environ.get("STOKER_KAFKA_BOOTSTRAP"):  # a broker that is up already (as the suite's conftest takes it)
        yield home, data
        return
    broker = stack.Broker(home=home / "kafka", port=TEST_KAFKA_PORT)
    stack.up(broker)
    try:
        yield home, data
    finally:
        stack.down(broker)


def each_variant(results: str, variants: Iterable[Any], run: Callable[[Any, Path, Path], list[dict]]) -> list[dict]:
    """``run(variant, a folder of its own, the sample's data)`` for each variant in the suite's environment; every
    row it returns is also appended to ``.stoker/bench/<results>`` as that variant finishes."""
    rows: list[dict] = []
    out = REPO / ".stoker" / "bench" / results
    out.parent.mkdir(parents=True, exist_ok=True)
    with environment() as (home, data), tempfile.TemporaryDirectory(dir=home) as tmp:
        for i, variant in enumerate(variants):
            new = run(variant, Path(tmp) / f"variant-{i}", data)
            rows += new
            with out.open("a") as f:
                f.writelines(json.dumps(r) + "\n" for r in new)
    return rows


def _text(raw: bytes) -> str | None:
    """A sample record's text; None for one of its bad records."""
    with contextlib.suppress(ValueError):
        doc = json.loads(raw)
        return doc.get("text") if isinstance(doc, dict) and isinstance(doc.get("text"), str) else None
    return None


def _mean(xs: list) -> float:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else float("nan")


if __name__ == "__main__":
    main()
