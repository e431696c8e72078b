"""The trainer's GPU step, its variants side by side in one process, with no Kafka.

    PYTHONPATH=. python3 bench/gpu_bench.py [--recipe small_1gpu] [--stages 2] [--variants eager,compile]
        [--micro-batches 8,16] [--steps 48] [--warmup 8]
    PYTHONPATH=. OMP_NUM_THREADS=1 python3 bench/gpu_bench.py --recipe debug_cpu --vocab 512 --seq-len 64 --steps 4
        --warmup 2 --stages 0 --micro-batches 2   # the CPU smoke test (one command line)

A row for every ZeRO stage x variant x micro-batch: ``eager`` is today's step (Hugging Face's eager
DeepSeek-V3, SDPA attention, grouped_mm experts), ``compile`` the same with ``recipe.compile`` (each decoder
layer through torch.compile; its warm-up steps include the compile). After the timed steps one more micro-step
runs under torch.profiler and the row names the attention kernels that actually ran (flash, memory-efficient,
cuDNN or the math fallback: MLA's q/k head dim, 192, differs from its v head dim, 128).

Batches come from an in-memory store: random documents (ids in [2, vocab), lengths ~ exponential
with mean seq_len/3) packed by the publisher's own Packer, encoded in the Kafka wire format
(stoker.run.records), then decoded and batched by the trainer's path (records.decode, make_batch,
to_tensors); the host time of that is the data wait, reported per micro-step as mean, p99 and max against the mean
micro-step. Each row builds the recipe's model
(build_model), initialises DeepSpeed with the trainer's ds_config (zero_stage overridden), and runs
the trainer's micro-step: forward with per-document position_ids, loss_sum, backward of loss/tokens,
engine.step(), the per-micro-step loss read-back and ExpertLoad's router hooks (bias update at each
optimizer step). --warmup and --steps should be multiples of grad_accum_steps.

MFU = tokens/s * F / peak, F (training FLOPs per token) = 6 * N_active + 6 * L * T * H * (d_qk + d_v):
N_active counts every parameter but the input embedding, with the routed experts' weights scaled by
experts_per_token / n_routed_experts (shared experts, router, dense layers, attention and lm_head in
full); the attention term is PaLM's 12*L*T*d for MLA heads (QK^T over d_qk = qk_nope + qk_rope, AV
over d_v, fwd + 2x bwd), counting the full T x T (no causal or document-mask discount).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import time
import traceback
import types
from pathlib import Path

import numpy as np

from spark_jobs.steps import Packer
from stoker.config.recipes import get_recipe, with_overrides
from stoker.run import records
from training.data.batch import make_batch
from training.schedule import ds_config
from training.trainer import loss_sum, to_tensors

EOS, PAD = 1, 0


class Store:
    """Packed sequences in the Kafka wire format, served in order, round and round."""

    def __init__(self, n: int, seq_len: int, vocab: int, seed: int = 0) -> None:
        rng, packer, self.seq_len = np.random.default_rng(seed), Packer(seq_len, EOS, PAD), seq_len
        dtype = records.dtype_for_vocab(vocab)
        self.items: list[tuple[bytes, list, bytes]] = []
        while len(self.items) < n:
            doc = rng.integers(2, vocab, size=1 + int(rng.exponential(seq_len / 3)))
            for p in packer.add(doc):
                self.items.append((records.encode_value(p.tokens, dtype),
                                   records.encode_headers("bench/gpu", dtype, p.doc_starts, p.valid),
                                   records.make_key(0, len(self.items))))
        self.at, self.wait, self.waits = 0, 0.0, []

    def next_tensors(self, batch_size: int, pad_id: int) -> tuple:
        t0 = time.perf_counter()
        rows = [self.items[(self.at + i) % len(self.items)] for i in range(batch_size)]
        self.at += batch_size
        seqs = [records.decode(v, h, self.seq_len) for v, h, _ in rows]
        batch = make_batch(seqs, [k for _, _, k in rows], self.seq_len)
        out = to_tensors(types.SimpleNamespace(batch=batch), self.seq_len, pad_id)
        self.waits.append(time.perf_counter() - t0)
        self.wait += self.waits[-1]
        return out


def flops_per_token(model, shape, seq_len: int) -> tuple[float, int, int]:
    """(training FLOPs per token, all parameters, active non-embedding parameters); see the docstring."""
    total = active = 0
    for name, p in model.named_parameters():
        total += p.numel()
        if "embed_tokens" in name:
            continue
        share = shape.experts_per_token / shape.n_routed_experts if ".mlp.experts." in name else 1.0
        active += p.numel() * share
    attn = 6 * shape.num_layers * seq_len * shape.num_heads * (
        shape.qk_nope_head_dim + shape.qk_rope_head_dim + shape.v_head_dim)
    return 6 * active + attn, total, int(active)


def init_distributed(cuda: bool) -> str:
    """World size 1, with the trainer's backends; whether a CPU-tensor all_reduce works in it (the trainer
    all_reduces CPU tensors)."""
    import deepspeed
    import torch
    import torch.distributed as dist

    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517", "RANK": "0", "LOCAL_RANK": "0",
                 "WORLD_SIZE": "1"}.items():
        os.environ.setdefault(k, v)
    from training.trainer import dist_backend

    if cuda:
        torch.cuda.set_device(0)
    deepspeed.init_distributed(dist_backend=dist_backend(cuda))
    try:
        dist.all_reduce(torch.zeros(2, dtype=torch.float64))
        return "ok"
    except Exception as e:  # reported, not raised: the trainer's CPU-tensor all_reduces would fail the same way
        return f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"


def micro_step(engine, loads, store: Store, recipe) -> tuple[int, float]:
    """The trainer's micro-step (Trainer.train_step / _micro_step / after_step on one rank)."""
    from training.model import update_bias

    input_ids, labels, position_ids, _, loads.real = store.next_tensors(recipe.micro_batch_size, PAD)
    tokens, dev = int((labels != -100).sum()), engine.device
    out = engine(input_ids=input_ids.to(dev), position_ids=position_ids.to(dev), use_cache=False)
    s = loss_sum(out.logits, labels)
    engine.backward(s / max(tokens, 1))
    before = engine.global_steps
    engine.step()
    if engine.global_steps != before:
        update_bias(engine.module, loads.take(), recipe.bias_update_speed)
    return tokens, float(s.detach()) / max(tokens, 1)


def build_engine(stage: int, variant: str, micro_batch: int, args, cuda: bool) -> tuple:
    """(engine, recipe, model facts): the recipe at ZeRO ``stage``, ``variant`` and ``micro_batch``, built and
    initialised as the trainer does."""
    import deepspeed
    import torch

    import training.model as tmodel

    over = ({"zero_stage": stage, "micro_batch_size": micro_batch, "compile": variant == "compile"}
            | ({"torch_adam": True} if args.torch_adam or not cuda else {}))
    recipe = with_overrides(get_recipe(args.recipe), over, "gpu_bench")
    with torch.device("cuda" if cuda else "cpu"):  # initialised in place: no 0.7B-parameter init on the host
        model = tmodel.build_model(recipe, args.vocab, args.seq_len, EOS, PAD)
    if recipe.compile:
        tmodel.compile_layers(model)
    fpt, n_total, n_active = flops_per_token(model, recipe.model, args.seq_len)
    facts = {"params": n_total, "active_params": n_active, "flops_per_token": fpt,
             "experts_impl": getattr(model.config, "_experts_implementation_internal", None),
             "attn_impl": getattr(model.config, "_attn_implementation", None)}
    total = -(-(args.warmup + args.steps) // recipe.grad_accum_steps)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                      config=ds_config(recipe, total))
    biases = [r.e_score_correction_bias for r in tmodel.routers(engine.module)]
    facts["router_bias_dtype_after_init"] = str(biases[0].dtype) if biases else None
    return engine, recipe, facts


def attention_kernels(engine, loads, store: Store, recipe, cuda: bool) -> list[str]:
    """The scaled-dot-product attention ops and kernels one profiled micro-step ran."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        micro_step(engine, loads, store, recipe)
    keys = ("scaled_dot_product", "flash", "efficient_attention", "cudnn_attention", "fmha", "sdpa")
    return sorted({e.key for e in prof.key_averages() if any(k in e.key.lower() for k in keys)})


def run_stage(stage: int, variant: str, micro_batch: int, args, store: Store, cuda: bool) -> dict:
    import torch

    from training.model import ExpertLoad

    mem0 = torch.cuda.memory_allocated() / 2**30 if cuda else None
    engine, recipe, facts = build_engine(stage, variant, micro_batch, args, cuda)
    loads, sync = ExpertLoad(engine.module), (torch.cuda.synchronize if cuda else (lambda: None))
    t_warm = time.perf_counter()
    for _ in range(args.warmup):
        micro_step(engine, loads, store, recipe)
    sync()
    warmup_s = time.perf_counter() - t_warm
    store.wait, store.waits, tokens, times, t0 = 0.0, [], 0, [], time.perf_counter()
    for _ in range(args.steps):  # the loss read-back syncs every micro-step, as in the trainer
        n, loss = micro_step(engine, loads, store, recipe)
        tokens += n
        times.append(time.perf_counter())
    sync()
    secs = time.perf_counter() - t0
    tps, step_s, waits = tokens / secs, secs / args.steps, sorted(store.waits)
    row = {"zero_stage": stage, "variant": variant, "micro_batch": micro_batch, "tokens_per_s": tps,
           "mfu": tps * facts["flops_per_token"] / (args.peak_tflops * 1e12),
           "data_wait_fraction": store.wait / secs,
           "data_wait_p99_fraction": waits[int(0.99 * (len(waits) - 1))] / step_s,
           "data_wait_max_fraction": waits[-1] / step_s, "micro_step_ms": 1e3 * step_s, "warmup_s": warmup_s,
           "attention_kernels": attention_kernels(engine, loads, store, recipe, cuda),
           "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None, "mem_at_start_gib": mem0,
           "final_loss": loss, "optimizer_steps": engine.global_steps, "optimizer": type(engine.optimizer).__name__,
           "router_bias_dtype_at_end": str(loads.routers[0].e_score_correction_bias.dtype) if loads.routers else None,
           "step_ms": [round(1e3 * (b - a), 2) for a, b in zip([t0, *times], times, strict=False)], **facts}
    loads.remove()
    engine.destroy()
    return row


def table(rows: list[dict]) -> str:
    cols = [("ZeRO", "zero_stage", "{}"), ("variant", "variant", "{}"), ("micro-batch", "micro_batch", "{}"),
            ("tokens/s", "tokens_per_s", "{:,.0f}"), ("MFU", "mfu", "{:.1%}"),
            ("wait mean", "data_wait_fraction", "{:.2%}"), ("wait p99", "data_wait_p99_fraction", "{:.2%}"),
            ("wait max", "data_wait_max_fraction", "{:.2%}"), ("micro-step ms", "micro_step_ms", "{:.1f}"),
            ("warm-up s", "warmup_s", "{:.0f}"),
            ("peak GiB", "peak_mem_gib", "{:.1f}"), ("final loss", "final_loss", "{:.3f}"),
            ("optimizer", "optimizer", "{}"), ("error", "error", "{}")]
    cells = [[h for h, _, _ in cols]] + [[f.format(r[k]) if r.get(k) is not None else "-" for _, k, f in cols]
                                         for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(cols))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def parse_args() -> argparse.Namespace:
    out = os.path.join(os.environ["OUT"], "gpu_bench.json") if os.environ.get("OUT") else None
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", default="small_1gpu")
    ap.add_argument("--stages", default="2", help="ZeRO stages, comma-separated")
    ap.add_argument("--variants", default="eager,compile", help="eager (today's step), compile (recipe.compile)")
    ap.add_argument("--micro-batches", default="8,16", help="micro-batch sizes, comma-separated")
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--warmup", type=int, default=8, help="untimed micro-steps per stage")
    ap.add_argument("--steps", type=int, default=48, help="timed micro-steps per stage")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H100/H200 SXM: 989)")
    ap.add_argument("--torch-adam", action=argparse.BooleanOptionalAction, default=True,
                    help="torch's AdamW (--no-torch-adam: the recipe's choice, e.g. a JIT-built FusedAdam)")
    ap.add_argument("--out", default=out, help="JSON results (default: $OUT/gpu_bench.json when OUT is set)")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    import deepspeed
    import torch
    import transformers

    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    cuda = torch.cuda.is_available()
    if not cuda:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    store = Store(256, args.seq_len, args.vocab)
    result: dict = {**vars(args), "device": torch.cuda.get_device_name() if cuda else "cpu",
                    "versions": {m.__name__: m.__version__ for m in (torch, transformers, deepspeed)},
                    "cpu_all_reduce_in_default_group": init_distributed(cuda), "stages": []}
    rows = [(int(s), v, int(b)) for s in args.stages.split(",") for v in args.variants.split(",")
            for b in args.micro_batches.split(",")]
    for stage, variant, micro_batch in rows:
        try:
            result["stages"].append(run_stage(stage, variant, micro_batch, args, store, cuda))
        except Exception as e:  # the other rows still run; the error is in the table and the JSON
            traceback.print_exc()
            result["stages"].append({"zero_stage": stage, "variant": variant, "micro_batch": micro_batch,
                                     "error": f"{type(e).__name__}: {e}"[:300]})
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        if args.out:  # after every stage: a run cut short keeps what it measured
            Path(args.out).write_text(json.dumps(result, indent=2))
    r: dict = next((r for r in result["stages"] if "params" in r), {})
    print(f"\n{args.recipe} on {result['device']}, {result['versions']}: {r.get('params', 0) / 1e6:.0f}M params, "
          f"{r.get('active_params', 0) / 1e6:.0f}M active non-embedding, {r.get('flops_per_token', 0) / 1e9:.2f} "
          f"GFLOP/token at seq_len {args.seq_len}; experts {r.get('experts_impl')}, attention {r.get('attn_impl')}; "
          f"MFU against {args.peak_tflops:.0f} TFLOP/s; CPU all_reduce: {result['cpu_all_reduce_in_default_group']}\n")
    print(table(result["stages"]))
    for r in result["stages"]:
        if "attention_kernels" in r:
            print(f"ZeRO {r['zero_stage']} {r['variant']} micro-batch {r['micro_batch']}: attention ran "
                  f"{', '.join(r['attention_kernels']) or 'no SDPA op'}")
    if args.out:
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
