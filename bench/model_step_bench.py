"""One training step of the CPU recipe's model, side by side with the shape it had before.

    .stoker/venv/bin/python -m bench.model_step_bench [--steps 8] [--threads 1]

Forward + backward + AdamW on one micro-batch (4 x 256 tokens, the sample tokenizer's 8192 ids), the two
models' steps interleaved, in one process with ``--threads`` torch threads (a rank's share of 2 cores is
1). The earlier ``debug_cpu`` shape (hidden 256, 4 layers) against today's (hidden 128, 2 layers): what the
test suite and ``make run`` pay per step. Prints seconds per step and the ratio.
"""

from __future__ import annotations

import argparse
import time


def _stepper(recipe: object) -> tuple[object, int]:
    import torch

    from training.model import build_model

    model = build_model(recipe, vocab_size=8192, seq_len=256, eos_id=0, pad_id=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 8192, (4, 256))

    def step() -> None:
        out = model(input_ids=x, labels=x, use_cache=False)
        out.loss.backward()
        opt.step()
        opt.zero_grad()

    return step, sum(p.numel() for p in model.parameters())


def interleaved(recipes: list[object], steps: int) -> list[tuple[float, int]]:
    """Seconds per step of each recipe's model, their steps interleaved (A, B, A, B, ...) so that whatever
    else the machine does falls on both alike; two warm-up steps each."""
    steppers = [_stepper(r) for r in recipes]
    spent = [0.0] * len(recipes)
    for i in range(steps + 2):
        for j, (step, _) in enumerate(steppers):
            t0 = time.perf_counter()
            step()  # type: ignore[operator]
            if i >= 2:
                spent[j] += time.perf_counter() - t0
    return [(spent[j] / steps, n) for j, (_, n) in enumerate(steppers)]


def main() -> None:
    import torch

    from stoker.config.recipes import ModelShape, TrainRecipe, debug_cpu

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    before = TrainRecipe(name="debug_cpu_before", model=ModelShape(hidden_size=256, num_layers=4,
                                                                     intermediate_size=512, moe_intermediate_size=128,
                                                                     kv_lora_rank=64))
    measured = interleaved([before, debug_cpu()], args.steps)
    rows = [("hidden 256, 4 layers (before)", *measured[0]), ("debug_cpu today", *measured[1])]
    for name, secs, params in rows:
        print(f"{name:<32} {params / 1e6:5.2f} M params  {secs:.3f} s/step")
    print(f"ratio: {rows[0][1] / rows[1][1]:.2f}x faster a step")


if __name__ == "__main__":
    main()
