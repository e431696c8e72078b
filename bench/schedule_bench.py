"""Three nights of one line per LR schedule (``train.lr_schedule``: rewarm, constant, wsd), through the DAG
(``dag.test()``) on the same data: whether the line's head gets better night after night, and what each
night costs the first night's data.

    .stoker/venv/bin/python -m bench.schedule_bench          (make bench-schedule; in make bench)

The sample's shards part-00000, -01, -02 are the three nights (clean, 20 documents a thousand held out), the
recipe is debug_cpu with one warm-up step, the same seed for every schedule. For each night: the gate's
decision, bits per byte of the night's model on its own held-out documents and on the first night's (the
figure a head must keep lowering). In the suite's environment, in a state folder of its own
(``.stoker/bench-home``); results in ``.stoker/bench/schedules.jsonl``, the table at the end is what
BENCHMARKS.md records.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ["STOKER_TEST_HOME"] = str(REPO / ".stoker" / "bench-home")  # read by the suite's conftest

SCHEDULES = ("rewarm", "constant", "wsd")
NIGHTS = {"2026-11-20": "part-00000.jsonl", "2026-11-21": "part-00001.jsonl", "2026-11-22": "part-00002.jsonl"}


def line_of(schedule: str, root: Path, sample_data: Path) -> list[dict]:
    from stoker.layout import LineLayout, RunLayout
    from tests.support import sabotage as ts

    shutil.rmtree(LineLayout.of(ts.CORPUS).folder, ignore_errors=True)
    for ds in NIGHTS:
        shutil.rmtree(RunLayout.of(ts.CORPUS, ds).run_dir, ignore_errors=True)
    corpora = ts.sabotage_corpora(root, sample_data, {ds: (shard, None) for ds, shard in NIGHTS.items()})
    config = corpora / f"{ts.CORPUS}.yaml"
    config.write_text(config.read_text().replace("train:\n", f"train:\n  lr_schedule: {schedule}\n", 1))
    first, out = min(NIGHTS), []
    for ds in NIGHTS:
        t0 = time.monotonic()
        ev = ts.run_night(corpora, ds)["eval"]
        sets = {name: f["all"]["bpb"] for name, f in ev["sets"].items()}
        out.append({"schedule": schedule, "ds": ds, "decision": ev["decision"]["decision"], "own": sets["night"],
                    "first": sets["night"] if ds == first else sets.get(f"forgetting:{first}.{ts.CORPUS}"),
                    "seconds": round(time.monotonic() - t0, 1)})
        print(json.dumps(out[-1]), flush=True)
    return out


def main() -> None:
    from bench.sabotage_bench import each_variant

    rows = each_variant("schedules.jsonl", SCHEDULES, line_of)
    print("\n| schedule | night | decision | own held-out (bits/byte) | first night's held-out | seconds |\n"
          "|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['schedule']} | {r['ds']} | {r['decision']} | {r['own']:.4f} | {r['first']:.4f} | "
              f"{r['seconds']:.0f} |")


if __name__ == "__main__":
    main()
