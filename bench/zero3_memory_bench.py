"""Each rank's peak memory when a night loads its parent and exports it, under ZeRO-0 and ZeRO-3.

    .stoker/venv/bin/python -m bench.zero3_memory_bench [--hidden 1024] [--layers 6] [--experts 16]
                                                       [--tree PATH]

A parent model of the DeepSeek-V3 shape given (about 190 M parameters, 0.75 GB in fp32, at the defaults) is saved
as a Hugging Face folder; the trainer (two ranks, gloo on the CPU) starts from it with ``--max-steps 1``, so it
does what a night does around its training and one step: load the parent, start the engine, one step (gradients
and the optimizer's state exist), a checkpoint and the export. (One step, not none: an earlier Stoker took
``--max-steps 0`` for the end of the data.) Each rank's resident set is sampled every 50 ms (psutil), and its peak
printed, with the wall time. ``--tree`` runs another checkout's trainer (an earlier Stoker) against the same
parent and topic, for the before/after comparison in BENCHMARKS.md. Needs `make setup`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from stoker import paths
from stoker.layout import RunLayout


def _sample(proc: subprocess.Popen, peaks: dict[int, int], stop: threading.Event) -> None:
    """The peak RSS of every rank (the launcher's own children), by pid; a rank's helpers are its children."""
    while not stop.is_set():
        try:
            for child in psutil.Process(proc.pid).children(recursive=False):
                try:
                    peaks[child.pid] = max(peaks.get(child.pid, 0), child.memory_info().rss)
                except psutil.Error:
                    continue
        except psutil.Error:
            return
        time.sleep(0.05)


def run_variant(tree: Path, manifest: Path, out: Path, parent: Path, zero: int, kafka_config: dict) -> dict:
    from stoker_local.servers import free_ports

    env = {**os.environ, "OMP_NUM_THREADS": "1", "STOKER_KAFKA_CONFIG": json.dumps(kafka_config),
           "PYTHONPATH": str(tree), "STOKER_HOME": str(paths.state_dir()), **paths.torch_build_env()}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(free_ports(1)), str(tree / "training" / "train.py"), "--manifest", str(manifest),
           "--plan", str(RunLayout.of_manifest(manifest).plan), "--out", str(out), "--micro-batch-size", "2",
           "--init-from", str(parent), "--max-steps", "1", "--set", f"zero_stage={zero}", "--group-id",
           f"zero3-bench-{time.time_ns()}"]
    out.mkdir(parents=True, exist_ok=True)
    peaks: dict[int, int] = {}
    stop = threading.Event()
    t0 = time.perf_counter()
    with open(out / "launch.log", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tree)
        sampler = threading.Thread(target=_sample, args=(proc, peaks, stop), daemon=True)
        sampler.start()
        rc = proc.wait(timeout=1800)
    stop.set()
    sampler.join()
    if rc != 0:
        sys.exit(f"ZeRO-{zero} in {tree} failed:\n{(out / 'launch.log').read_text()[-3000:]}")
    return {"zero": zero, "tree": str(tree), "seconds": round(time.perf_counter() - t0, 1),
            "peak_rss_mib": sorted(v // 2**20 for v in peaks.values() if v >= 2**20)}  # not a helper gone at once


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--tree", type=Path, default=paths.project_root())
    ap.add_argument("--run-dir", type=Path, help="a published run (manifest and plan) to train on; default: one made "
                                                  "here (an earlier Stoker's trainer may need a plan of its own)")
    args = ap.parse_args()
    import dataclasses

    from safetensors import safe_open

    from stoker.config.recipes import debug_cpu
    from stoker_local import broker
    from tests.support.trainer_tools import publish_run, write_plan
    from training.model import build_model, special_ids

    config = broker.up().client_config()
    work = paths.state_dir() / "bench" / "zero3-memory"
    manifest = RunLayout(args.run_dir.resolve() if args.run_dir else work / "run").manifest
    parent = work / f"parent-h{args.hidden}-l{args.layers}-e{args.experts}"
    tokenizer = paths.state_dir() / "tokenizers" / "sample-bpe-8192" / "tokenizer.json"
    if not manifest.is_file():
        publish_run(config, tokenizer, work / "run", partitions=4, per_partition=4, seq_len=32, name="zero3bench")
        write_plan(manifest)
    from stoker.run.manifest import read_manifest

    m = read_manifest(manifest)
    if not (parent / "model.safetensors").is_file():
        base = debug_cpu()
        shape = dataclasses.replace(base.model, hidden_size=args.hidden, num_layers=args.layers,
                                    intermediate_size=args.hidden * 11 // 4, moe_intermediate_size=args.hidden // 2,
                                    n_routed_experts=args.experts, kv_lora_rank=args.hidden // 4)
        build_model(dataclasses.replace(base, model=shape), m.vocab_size, m.seq_len,
                    *special_ids(m)).save_pretrained(parent, safe_serialization=True)
    with safe_open(str(parent / "model.safetensors"), "pt") as f:
        params = sum(_numel(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118 - no __iter__
    print(f"parent: {params / 1e6:.0f} M parameters ({params * 4 / 2**30:.2f} GiB in fp32), 2 ranks, "
          f"cores: {os.cpu_count()}; trainer of {args.tree}", flush=True)
    for zero in (0, 3):
        r = run_variant(args.tree, manifest, work / f"out-z{zero}-{time.time_ns()}", parent, zero, config)
        print(json.dumps(r), flush=True)
    return 0


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


if __name__ == "__main__":
    raise SystemExit(main())
