"""DeepSpeed trainer fed from Kafka: the command line of :class:`training.trainer.Trainer`.

    torchrun --nproc_per_node 2 -m training.train --manifest RUN/manifest.json --plan RUN/plan.json \
        --out RUN/train/<topic>
    deepspeed --num_gpus 2 --module training.train ...      (on GPUs; on CPU use torchrun)

Checkpoints (every ``checkpoint_every`` optimizer steps and at the end) hold the model, optimizer,
scheduler, the Kafka offsets of every partition and the run's progress counters; the offsets are
then committed to the consumer group. On start the latest checkpoint in ``--out/checkpoints`` is
resumed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

from training.data.kafka_source import DataLost
from training.trainer import TrainArgs, Trainer


def parse_args(argv: list[str] | None = None) -> TrainArgs:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manifest", required=True, help="the run's manifest")
    ap.add_argument("--out", required=True, help="the trainer's folder: checkpoints/, metrics, export go here")
    ap.add_argument("--plan", required=True, help="the run plan (<run folder>/plan.json): the recipe, the optimizer "
                    "and the LR schedule across nights are its corpus's train settings, decided once for the run")
    ap.add_argument("--group-id", help="training consumer group (default: the run layout's group of the topic)")
    ap.add_argument("--max-steps", type=int, help="stop after this many steps (default: the whole run)")
    ap.add_argument("--micro-batch-size", type=int)
    ap.add_argument("--checkpoint-every", type=int)
    ap.add_argument("--log-keys", help="append each step's sequence keys to this file ({rank} = the rank)")
    ap.add_argument("--init-from", help="start from this model when --out holds no checkpoint: a night of a "
                    "model line or a local Hugging Face folder, as the train task decided at this launch (default: "
                    "random weights in the recipe's shape)")
    ap.add_argument("--mix", help="a mixture night's plan (stoker.lines.mix_plan): train the rows it names of every "
                    "component's topic at its shares; --manifest is then its lead component")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a value of the plan's recipe (lr=3e-4, model.num_layers=8) for a debugging or "
                    "benchmark session; validated like a recipe file")
    ap.add_argument("--secrets-file", help="a 0600 JSON file of environment entries (STOKER_KAFKA_CONFIG) for "
                    "ranks on nodes the launcher reached over ssh")
    ap.add_argument("--local_rank", type=int, help=argparse.SUPPRESS)  # passed by the deepspeed launcher
    ns = vars(ap.parse_args(argv))
    ns.pop("local_rank")
    secrets = ns.pop("secrets_file")
    if secrets:
        from stoker.paths import load_private_env

        load_private_env(secrets)
    return TrainArgs(**ns)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        summary = Trainer(args).train()
    except DataLost as e:  # no relaunch can fix it: say so where the train task looks
        from stoker.files import atomic_write_json
        from stoker.layout import TrainerFiles

        atomic_write_json(TrainerFiles(Path(args.out)).failure, {"reason": "data_lost", "message": str(e)})
        raise
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({k: summary.get(k) for k in ("steps", "first_loss", "last_loss", "export")}))
        _evaluate(args)
    return 0


def _evaluate(args: TrainArgs) -> None:
    """The night's held-out scores while torch and transformers are loaded (training/evaluate.py); a failure
    here only costs the evaluate task its own process."""
    import torch

    from training.evaluate import evaluate_night

    log = logging.getLogger("stoker.train")
    torch.set_num_threads(max(1, os.cpu_count() or 1))  # the other ranks are done: rank 0 has the machine
    try:
        result = evaluate_night(args.manifest, args.plan, args.out, args.mix)
    except Exception:  # noqa: BLE001 - the model is trained and exported; the evaluate task scores it itself
        log.warning("scoring the held-out sets failed; the evaluate task will score them", exc_info=True)
        return
    if result is not None:
        log.info("held-out scores of %s in %.1f s: %s", result["model"], result["seconds"],
                 ", ".join(f"{k} {v['all']['bpb']:.4f}" for k, v in result["sets"].items()))


if __name__ == "__main__":
    raise SystemExit(main())
