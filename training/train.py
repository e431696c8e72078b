"""DeepSpeed trainer fed from Kafka: ``train()`` reads like an outline.

    torchrun --nproc_per_node 2 training/train.py --manifest RUN/manifest.json --out RUN/train
    deepspeed --num_gpus 2 training/train.py ...          (on GPUs; on CPU use torchrun)

Each rank reads its share of the run's partitions (training/data/kafka_source.py). A step
all-reduces how many tokens every rank holds, so ranks that run out of data at different steps
never hang a collective: a rank with nothing left joins the step with an empty (fully masked)
batch until every rank is out, and the loss is normalised by the global token count. Every
sequence of the manifest is therefore trained on exactly once, and the consumer group ends at the
manifest's end offsets (lag 0).

Checkpoints (every ``checkpoint_every`` optimizer steps and at the end) hold the model, optimizer,
scheduler and the Kafka offsets of every partition; the offsets are then committed to the
consumer group. On start the latest checkpoint in ``--out/checkpoints`` is resumed.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

from stoker import kafka as skafka
from stoker.manifest import Manifest, read_manifest
from training import checkpoint
from training.recipes import TrainRecipe, get_recipe

log = logging.getLogger("stoker.train")


def ds_config(recipe: TrainRecipe, total_steps: int) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": recipe.micro_batch_size,
        "gradient_accumulation_steps": recipe.grad_accum_steps,
        "gradient_clipping": recipe.grad_clip,
        "optimizer": {"type": "AdamW", "params": {
            "lr": recipe.lr, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": recipe.weight_decay,
            "torch_adam": recipe.torch_adam}},
        "scheduler": {"type": "WarmupCosineLR", "params": {
            "total_num_steps": max(total_steps, recipe.warmup_steps + 1), "warmup_num_steps": recipe.warmup_steps,
            "warmup_min_ratio": 0.0, "cos_min_ratio": recipe.min_lr_ratio}},
        "zero_optimization": {"stage": recipe.zero_stage},
        "bf16": {"enabled": recipe.bf16},
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def special_ids(manifest: Manifest) -> tuple[int, int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(manifest.tokenizer_path)
    eos, pad = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|pad|>")
    return int(eos if eos is not None else 0), int(pad if pad is not None else 0)


def to_tensors(pending: Any, seq_len: int, pad_id: int) -> tuple[Any, Any, Any, list[bytes]]:
    """The batch as tensors; an empty (fully masked) one-row batch when this rank has no data left."""
    import torch

    if pending is None:
        ids = torch.full((1, seq_len), pad_id, dtype=torch.long)
        return ids, torch.full_like(ids, -100), torch.arange(seq_len).unsqueeze(0), []
    b = pending.batch
    return (torch.from_numpy(b.input_ids), torch.from_numpy(b.labels), torch.from_numpy(b.position_ids), b.keys)


def loss_sum(logits: Any, labels: Any) -> Any:
    import torch.nn.functional as F

    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1).to(logits.device),
                           ignore_index=-100, reduction="sum")


def train(args: argparse.Namespace) -> dict[str, Any]:
    import deepspeed
    import torch
    import torch.distributed as dist

    from training.data.kafka_source import KafkaTokenSource
    from training.metrics import Metrics, plot_loss, read_metrics
    from training.model import ExpertLoad, balance_stats, build_model, update_bias

    # -- set-up: distributed, data, model, engine ----------------------------------------------------
    cpu = not torch.cuda.is_available()
    deepspeed.init_distributed(dist_backend="gloo" if cpu else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    manifest = read_manifest(args.manifest)
    recipe = get_recipe(args.recipe)
    if args.micro_batch_size:
        recipe.micro_batch_size = args.micro_batch_size
    if args.checkpoint_every:
        recipe.checkpoint_every = args.checkpoint_every
    out, ckpt_dir = Path(args.out), Path(args.out) / "checkpoints"
    out.mkdir(parents=True, exist_ok=True)
    kafka_config = skafka.config_from_env()
    group_id = args.group_id or f"stoker-train.{manifest.topic}"
    eos_id, pad_id = special_ids(manifest)
    seq_len = manifest.seq_len

    global_batch = recipe.micro_batch_size * world
    total_steps = math.ceil(manifest.sequences / global_batch / recipe.grad_accum_steps)
    model = build_model(recipe, manifest.vocab_size, seq_len, eos_id, pad_id)
    engine, _opt, _data, _sched = deepspeed.initialize(
        model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=ds_config(recipe, total_steps))
    source = KafkaTokenSource(kafka_config=kafka_config, manifest=manifest, rank=rank, world=world,
                              batch_size=recipe.micro_batch_size, group_id=group_id)
    step, first_loss = 0, None
    done_sequences = done_tokens = 0  # over every session of this run, restored from the checkpoint
    run_identity = checkpoint.manifest_identity(manifest)

    def progress() -> dict[str, Any]:
        return {"first_loss": first_loss, "sequences": done_sequences, "tokens": done_tokens,
                "manifest": run_identity}

    if checkpoint.has_checkpoint(ckpt_dir):
        client = checkpoint.load(engine, ckpt_dir, expect_manifest=run_identity)
        source.load_state_dict(client["data"])
        step, first_loss = client["step"], client.get("first_loss")
        done_sequences, done_tokens = client.get("sequences", 0), client.get("tokens", 0)
    loads = ExpertLoad(engine.module)
    metrics = Metrics(out, enabled=rank == 0)
    keys_log = None
    if args.log_keys:
        Path(args.log_keys).parent.mkdir(parents=True, exist_ok=True)
        keys_log = open(args.log_keys.replace("{rank}", str(rank)), "a")  # noqa: SIM115 - closed at the end
    device = engine.device
    log.info("rank %d/%d: partitions %s, %d offsets left, starting at step %d", rank, world, source.partitions,
             source.remaining(), step)

    # -- the loop ----------------------------------------------------------------------------------------
    seen_sequences = seen_tokens = 0
    t_start, wait_start = time.perf_counter(), source.wait_seconds
    loss, saved_step, data = None, -1, None
    while args.max_steps is None or step < args.max_steps:
        t0, w0 = time.perf_counter(), source.wait_seconds
        pending = source.next_batch()
        input_ids, labels, position_ids, keys = to_tensors(pending, seq_len, pad_id)
        local = torch.tensor([len(keys), int((labels != -100).sum())], dtype=torch.float64)
        dist.all_reduce(local)  # a sync point: every rank learns whether anyone still has data
        global_rows, global_tokens = int(local[0]), float(local[1])
        if global_rows == 0:
            break
        # attention_mask=None + per-document position_ids: block-diagonal causal attention
        out_ = engine(input_ids=input_ids.to(device), position_ids=position_ids.to(device), use_cache=False)
        s = loss_sum(out_.logits, labels)
        engine.backward(s / max(global_tokens, 1.0) * world)  # DeepSpeed averages over ranks
        engine.step()
        if pending is not None:
            source.commit(pending)
        step += 1
        if keys_log:
            keys_log.write(json.dumps({"step": step, "keys": [k.decode() for k in keys]}) + "\n")
            keys_log.flush()

        # -- after the step: balancing, metrics, checkpoint ---------------------------------------------
        expert = [c.clone() for c in loads.take()]
        for c in expert:
            dist.all_reduce(c)
        if recipe.bias_update_speed > 0:
            update_bias(engine.module, expert, recipe.bias_update_speed)
        total = torch.tensor([float(s.detach())], dtype=torch.float64)
        dist.all_reduce(total)
        loss = float(total[0]) / max(global_tokens, 1.0)
        first_loss = loss if first_loss is None else first_loss
        seen_sequences += global_rows
        seen_tokens += int(global_tokens)
        done_sequences += global_rows
        done_tokens += int(global_tokens)
        dt = time.perf_counter() - t0
        metrics.log(step, {"loss": loss, "lr": engine.get_lr()[0], "tokens_per_s": global_tokens / dt,
                           "data_wait_fraction": (source.wait_seconds - w0) / dt, **balance_stats(expert)})
        if engine.is_gradient_accumulation_boundary() and engine.global_steps % recipe.checkpoint_every == 0:
            data = checkpoint.save(engine, source, step, ckpt_dir, kafka_config=kafka_config, group_id=group_id,
                                   extra=progress())
            saved_step = step

    # -- the end: last checkpoint, export, summary ----------------------------------------------------------
    if saved_step != step:
        data = checkpoint.save(engine, source, step, ckpt_dir, kafka_config=kafka_config, group_id=group_id,
                               extra=progress())
    elapsed = time.perf_counter() - t_start
    waits = torch.tensor([source.wait_seconds - wait_start], dtype=torch.float64)
    dist.all_reduce(waits)
    summary = {"steps": step, "sequences_this_session": seen_sequences, "tokens_this_session": seen_tokens,
               "sequences_consumed": done_sequences, "tokens_consumed": done_tokens,
               "sequences_published": manifest.sequences,
               "first_loss": first_loss, "last_loss": loss, "data_wait_fraction": float(waits[0]) / world / elapsed,
               "checkpoint": str(ckpt_dir), "next_offsets": data["next_offsets"], "world_size": world,
               "group_id": group_id, "topic": manifest.topic, "recipe": recipe.name}
    if rank == 0:
        summary.update(export(engine.module, manifest, out))
        rows = read_metrics(out / "metrics.jsonl")
        if rows:
            summary["loss_curve"] = str(plot_loss(rows, out / "loss.png"))
        (out / "train_summary.json").write_text(json.dumps(summary, indent=2))
    metrics.close()
    source.close()
    if keys_log:
        keys_log.close()
    dist.barrier()
    return summary


def export(model: Any, manifest: Manifest, out: Path) -> dict[str, str]:
    """An HF folder loadable offline by ``AutoModelForCausalLM.from_pretrained`` (+ the tokenizer file)."""
    path = out / "hf"
    model.save_pretrained(str(path), safe_serialization=True)
    shutil.copy(manifest.tokenizer_path, path / "tokenizer.json")
    return {"export": str(path)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manifest", required=True, help="the run's manifest.json")
    ap.add_argument("--out", required=True, help="checkpoints/, metrics, export go here")
    ap.add_argument("--recipe", default="debug_cpu")
    ap.add_argument("--group-id", help="training consumer group (default stoker-train.<topic>)")
    ap.add_argument("--max-steps", type=int, help="stop after this many steps (default: the whole run)")
    ap.add_argument("--micro-batch-size", type=int)
    ap.add_argument("--checkpoint-every", type=int)
    ap.add_argument("--log-keys", help="append each step's sequence keys to this file ({rank} = the rank)")
    ap.add_argument("--local_rank", type=int, help=argparse.SUPPRESS)  # passed by the deepspeed launcher
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    summary = train(parse_args(argv))
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({k: summary.get(k) for k in ("steps", "first_loss", "last_loss", "export")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
