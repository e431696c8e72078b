"""The pack pass's per-record parts, each cut measured against the code it replaced, in one process.

    .stoker/venv/bin/python -m bench.pack_parts_bench [--mb 100]     (part of `make bench`)

On ``--mb`` of the scale bench's JSONL (bench/scale_bench.py ``documents``; one core, best of 3):

* parsing each line: the exact path (``json.loads`` of the decoded line, then the lone-surrogate check) against
  the fast one (orjson on the bytes, the exact path only for what it refuses), same Parsed for every line;
* packing: the Packer fed one document per call against a batch of 1,024 per call (one copy and array cuts),
  the same windows;
* encoding: ``tokenizers`` against ``fastokens`` (flat), one thread each, the same ids; and what the pack
  task's check of every 100th document (``tokenizer.check_every``) costs.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # one core, as in a Spark task
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.scale_bench import _line, documents  # noqa: E402
from spark_jobs import steps  # noqa: E402
from spark_jobs.streams import lines_of  # noqa: E402
from spark_jobs.tokenizer_backends import TaskParity, encoders, same_ids  # noqa: E402
from stoker import paths  # noqa: E402


def best(f, n: int = 3) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=100)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=paths.state_dir()) as tmp:
        path, size = Path(tmp) / "night.jsonl", 0
        with open(path, "wb") as f:
            for n, text in documents():
                line = _line(n, text) + b"\n"
                f.write(line)
                size += len(line)
                if size >= args.mb * 1e6:
                    break
        with open(path, "rb") as f:
            lines = [raw for _, raw, _ in lines_of(f, 0, size, 1 << 22)]
    exact = [steps._parse_line_exactly("f", 0, r, "jsonl", "text") for r in lines]
    fast = [steps.parse_line("f", 0, r, "jsonl", "text") for r in lines]
    assert exact == fast, "the fast parse gave another record"
    t_exact = best(lambda: [steps._parse_line_exactly("f", 0, r, "jsonl", "text") for r in lines])
    t_fast = best(lambda: [steps.parse_line("f", 0, r, "jsonl", "text") for r in lines])
    print(f"{len(lines):,} lines, {size / 1e6:.0f} MB, one core")
    print(f"parse: exact {t_exact:.2f} s, fast {t_fast:.2f} s: {t_exact / t_fast:.1f}x")

    texts = [p.text for p in fast if p.text]
    tokenizer = (paths.state_dir() / "tokenizers" / "sample-bpe-8192" / "tokenizer.json").read_text()
    fast_enc, ref_enc = encoders("bench", tokenizer, "fastokens")
    batches = [texts[i:i + 1024] for i in range(0, len(texts), 1024)]
    ids = [x for b in batches for x in fast_enc.encode_batch(b)]
    ref_ids = [x for b in batches for x in ref_enc.encode_batch(b)]  # type: ignore[union-attr]
    assert all(same_ids(a, b) for a, b in zip(ids, ref_ids, strict=True)), "the backends gave other ids"
    t_ref = best(lambda: [ref_enc.encode_batch(b) for b in batches], 1)  # type: ignore[union-attr]
    t_fast_enc = best(lambda: [fast_enc.encode_batch(b) for b in batches])
    print(f"encode: tokenizers {t_ref:.2f} s, fastokens {t_fast_enc:.2f} s: {t_ref / t_fast_enc:.1f}x")

    def checked(every: int) -> int:
        parity = TaskParity(ref_enc, every)
        for b, start in zip(batches, range(0, len(ids), 1024), strict=True):
            parity.check(b, ids[start:start + len(b)], ["f"] * len(b), list(range(len(b))))
        return parity.checked

    t_check = best(lambda: checked(100))
    print(f"check every 100th document against tokenizers ({checked(100):,} of {len(ids):,}): {t_check:.2f} s, "
          f"{t_check / (t_fast + t_fast_enc):.0%} of the fast parse + encode")

    def one() -> list:
        p = steps.Packer(2048, 0, 1)
        return [w.doc_starts for x in ids for w in p.add(x)]

    def batch() -> list:
        p = steps.Packer(2048, 0, 1)
        return [w.doc_starts for i in range(0, len(ids), 1024) for w in p.add_batch(ids[i:i + 1024])]

    assert one() == batch(), "batches packed other windows"
    t_one, t_batch = best(one), best(batch)
    print(f"pack: one document a call {t_one:.2f} s, 1,024 a call {t_batch:.2f} s: {t_one / t_batch:.1f}x")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
