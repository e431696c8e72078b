"""The Trainer: construction builds the parts (distributed, data, model, engine, metrics);
``train_step()`` does one step and returns its stats; ``checkpoint()`` and ``finish()`` save and
wrap up; ``train()`` is the loop over them.

Each rank reads its share of the run's partitions (training/data/kafka_source.py). A step
all-reduces how many rows and tokens every rank holds, so ranks that run out of data at different
steps never hang a collective: a rank with nothing left joins the step with an empty (fully
masked) batch until every rank is out, and the loss is normalised by the global token count.
Every sequence of the manifest is therefore trained on exactly once, and the consumer group ends
at the manifest's end offsets (lag 0).
"""

from __future__ import annotations

import json
import logging
import math
import os
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stoker.config.corpus import Optimizer
from stoker.config.recipes import TrainRecipe, get_recipe
from stoker.files import atomic_write_json
from stoker.kafka.settings import config_from_env
from stoker.layout import TrainerFiles, checkpoint_tag, consumer_group
from stoker.run.manifest import read_manifest
from stoker.run.plan import read_plan
from training import checkpoint, inherit
from training.data.kafka_source import verify_consumed
from training.export import export
from training.model import special_ids as model_ids
from training.progress import Progress, StepStats

log = logging.getLogger("stoker.train")


@dataclass(kw_only=True, slots=True)
class TrainArgs:
    """What one training session is asked to do (``training/train.py``'s command line)."""

    manifest: str
    """The run's manifest.json."""
    plan: str
    """The run's plan (``plan.json`` beside the manifest): the recipe and the line's settings across nights (the
    optimizer, the LR schedule and its cooldown) are its corpus's ``train.*``, decided once for the run."""
    out: str
    """The trainer's folder (the run layout's ``train/<topic>``): checkpoints, metrics, export."""
    group_id: str | None = None
    """Training consumer group (default: the layout's ``stoker-train.<topic>``)."""
    max_steps: int | None = None
    """Stop after this many steps (default: the whole run)."""
    micro_batch_size: int | None = None
    checkpoint_every: int | None = None
    log_keys: str | None = None
    """Append each step's sequence keys to this file (``{rank}`` = the rank)."""
    init_from: str | None = None
    """Start from this model when the folder holds no checkpoint yet: a night of a model line or a
    local Hugging Face folder (default: random weights in the recipe's shape). The train task decides the
    parent at each launch (``stoker_airflow.lines.launch_parent``) and hands it over here."""
    mix: str | None = None
    """A mixture night's plan (:mod:`stoker.lines.mix_plan`): train the rows it names of every component's topic,
    dealt by :class:`training.data.mixture_source.MixtureSource`; ``manifest`` is then one of its components (the
    lead: the trainer folder, the consumer group and the checks of a publication are its)."""
    set: list[str] = field(default_factory=list)
    """Recipe overrides ``KEY=VALUE`` (``lr=3e-4``, ``model.num_layers=8``), validated like a recipe file."""


def dist_backend(cuda: bool) -> str:
    """The process group's backends: NCCL for the model's CUDA tensors, and gloo for the trainer's own
    small CPU tensors (the step's row and token counts, expert loads, flags), which NCCL cannot reduce."""
    return "cpu:gloo,cuda:nccl" if cuda else "gloo"


def to_tensors(pending: Any, seq_len: int, pad_id: int) -> tuple[Any, Any, Any, list[bytes], Any]:
    """The batch as tensors (ids, labels, positions, keys, real-token mask); an empty (fully masked) one-row
    batch when this rank has no data left."""
    import torch

    if pending is None:
        ids = torch.full((1, seq_len), pad_id, dtype=torch.long)
        return (ids, torch.full_like(ids, -100), torch.arange(seq_len).unsqueeze(0), [],
                torch.zeros(ids.shape, dtype=torch.bool))
    b = pending.batch
    real = torch.from_numpy(b.real) if b.real is not None else torch.ones(b.input_ids.shape, dtype=torch.bool)
    return (torch.from_numpy(b.input_ids), torch.from_numpy(b.labels), torch.from_numpy(b.position_ids), b.keys,
            real)


def loss_sum(logits: Any, labels: Any) -> Any:
    import torch.nn.functional as F

    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1).to(logits.device),
                           ignore_index=-100, reduction="sum")


def resolve_recipe(args: TrainArgs, name: str) -> TrainRecipe:
    """The plan's recipe with the command line's overrides, built and validated as a recipe file is."""
    from stoker.config.recipes import parse_overrides, with_overrides

    overrides = parse_overrides(list(args.set))
    for key in ("micro_batch_size", "checkpoint_every"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    return with_overrides(get_recipe(name), overrides, "command line") if overrides else get_recipe(name)


class Trainer:
    """One training session on one run topic; resumes the latest checkpoint in its folder."""

    def __init__(self, args: TrainArgs) -> None:
        self.files = TrainerFiles(Path(args.out))
        self.files.folder.mkdir(parents=True, exist_ok=True)
        self.rank = int(os.environ.get("RANK", "0"))
        self._phase("importing torch and DeepSpeed")
        import deepspeed
        import torch
        import torch.distributed as dist

        from training.data.kafka_source import KafkaTokenSource
        from training.data.replay import load_rows, with_replay
        from training.metrics import Metrics
        from training.model import ExpertLoad, balance_stats
        from training.schedule import lr_plan

        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        self._phase(f"joining the other ranks (world {os.environ.get('WORLD_SIZE', '1')}; on a first run DeepSpeed "
                    "also compiles its shared-memory op, ~30 s, cached after)")
        deepspeed.init_distributed(dist_backend=dist_backend(torch.cuda.is_available()))
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        # the corpus's train settings, as the run's plan decided them once for every stage
        self.train_config = read_plan(args.plan).corpus.train
        self.args, self.manifest = args, read_manifest(args.manifest)
        self.recipe = resolve_recipe(args, self.train_config.recipe)
        self.kafka_config = config_from_env()
        self.group_id = args.group_id or consumer_group(self.manifest.topic)
        self.eos_id, self.pad_id = model_ids(self.manifest)
        global_batch = self.recipe.micro_batch_size * self.world * self.recipe.grad_accum_steps
        replay = load_rows(self.files.replay)  # train.replay: rows of the line's earlier nights, mixed in
        rows = self.manifest.sequences + (len(replay) if replay is not None else 0)
        self.mix = self._mix_plan(replay)
        if self.mix is not None:
            rows = self.mix.night.total
        config, client_scheduler, self.fork_at = lr_plan(self.recipe, self.train_config.lr_schedule,
                                                         self.train_config.cooldown_share,
                                                         math.ceil(rows / global_batch),
                                                         inherit.is_night(args.init_from))
        model = self._model(config)
        self.held_at_load = inherit.held_parameters(model)
        """Parameters this rank held once the weights were loaded: under ZeRO-3 its shard, not the model."""
        self._phase(f"starting the DeepSpeed engine (ZeRO {self.recipe.zero_stage}, "
                    f"{'bf16' if self.recipe.bf16 else 'fp32'})")
        self.engine, *_ = deepspeed.initialize(
            model=model, model_parameters=[p for p in model.parameters() if p.requires_grad], config=config,
            lr_scheduler=client_scheduler)
        self._phase(f"opening the run topic {self.manifest.topic} (group {self.group_id})")
        self.source = self._source(replay) if self.mix is not None else with_replay(KafkaTokenSource(
            kafka_config=self.kafka_config, manifest=self.manifest, rank=self.rank, world=self.world,
            group_id=self.group_id, batch_size=self.recipe.micro_batch_size), replay)
        self.progress = Progress(publication=self.manifest.publication)
        self.data_state: dict[str, Any] = {}
        self.saved_step = -1
        self.window = 0
        """Micro-steps since the last optimizer step (checkpoints are taken only at 0)."""
        self.window_keys: list[tuple[int, list[bytes]]] = []
        """This window's (step, keys), written to the keys audit log when its optimizer step runs."""
        self._resume()
        self._phase("reading the first batch")
        self.loads = ExpertLoad(self.engine.module)
        self.balance = balance_stats([])
        self.metrics = Metrics(self.files, enabled=self.rank == 0)
        self.keys_log = self._open_keys_log()
        log.info("rank %d/%d: partitions %s, %d offsets left, starting at step %d", self.rank, self.world,
                 self.source.partitions, self.source.remaining(), self.progress.step)

    def _mix_plan(self, replay: Any) -> Any:
        """The ``--mix`` night's plan, its lead manifest checked to be one of its components."""
        if not self.args.mix:
            return None
        from stoker.exceptions import StokerError
        from stoker.lines.mix_plan import read_plan

        plan = read_plan(self.args.mix)
        topics = {k: m.topic for k, m in plan.read_manifests().items()}
        if self.manifest.topic not in topics.values():
            raise StokerError(f"--manifest {self.args.manifest} (topic {self.manifest.topic}) is not a component of "
                              f"the mix plan {self.args.mix} ({topics})")
        if replay is not None:
            raise StokerError("train.replay with a mix plan: replay as a component of the mixture is not built yet; "
                              "train the night without train.replay, or without --mix")
        return plan

    def _source(self, replay: Any) -> Any:
        from training.data.mixture_source import MixtureSource

        return MixtureSource(kafka_config=self.kafka_config, plan=self.mix, manifests=self.mix.read_manifests(),
                             rank=self.rank, world=self.world, micro_batch_size=self.recipe.micro_batch_size,
                             accumulation=self.recipe.grad_accum_steps, group_id=self.group_id)

    def _model(self, ds_config: dict[str, Any]) -> Any:
        """The weights the night starts from: its parent's (under ZeRO-3 loaded straight into each rank's shard),
        or the recipe's shape at random; with ``recipe.compile``, its decoder layers compiled."""
        from training.model import build_model, compile_layers

        if self.args.init_from:
            self._phase(f"loading the weights it continues from {self.args.init_from}")
            model = inherit.load_model(self.args.init_from, self.manifest.seq_len, self.manifest.vocab_size, ds_config)
        else:
            self._phase(f"building the {self.recipe.name} model (random weights)")
            model = build_model(self.recipe, self.manifest.vocab_size, self.manifest.seq_len, self.eos_id, self.pad_id)
        if self.recipe.compile:
            self._phase("compiling its decoder layers (torch.compile: the first micro-steps build the kernels)")
            compile_layers(model)
        return model

    def _resume(self) -> None:
        if not checkpoint.has_checkpoint(self.files.checkpoints):  # this night's first launch
            if self.train_config.optimizer == Optimizer.CARRY:
                inherit.carry_optimizer(self.engine, self.args.init_from, self.recipe)
            return
        self._phase(f"loading its last checkpoint from {self.files.checkpoints}")
        slots = checkpoint.load(self.engine, self.files.checkpoints, expect_manifest=self.progress.publication)
        checkpoint.restore(slots, {"data": self.source, "progress": self.progress})
        self.saved_step = self.progress.step

    def _phase(self, what: str) -> None:
        """Say what start-up is doing (rank 0, for ``stoker refresh``'s live line and the log)."""
        if self.rank == 0:
            log.info("start-up: %s", what)
            atomic_write_json(self.files.phase, {"phase": what, "at": time.time()})

    def _open_keys_log(self) -> Any:
        if not self.args.log_keys:
            return None
        from training.metrics import open_log

        return open_log(Path(self.args.log_keys.replace("{rank}", str(self.rank))))  # closed in finish()

    def train_step(self) -> StepStats | None:
        """One step on every rank; None once no rank has data left."""
        import torch
        import torch.distributed as dist

        t0, w0 = time.perf_counter(), self.source.wait_seconds
        pending = self.source.next_batch()
        input_ids, labels, position_ids, keys, self.loads.real = to_tensors(pending, self.manifest.seq_len,
                                                                            self.pad_id)
        mine = int((labels != -100).sum())
        mixed = self.source.local_counts(pending) if self.mix is not None else []  # per component (--mix)
        local = torch.tensor([len(keys), mine, *mixed], dtype=torch.float64)
        dist.all_reduce(local)  # a sync point: every rank learns whether anyone still has data
        rows, tokens = int(local[0]), float(local[1])
        if rows == 0:  # every rank is out of data
            return self._close_window(t0) if self.window else None
        if self.mix is not None:
            self.source.account(local[2:].tolist())
        s, stepped = self._micro_step(input_ids, labels, position_ids, tokens)
        if pending is not None:
            self.source.mark_trained(pending)
        total = torch.tensor([float(s.detach())], dtype=torch.float64)
        dist.all_reduce(total)
        return StepStats(step=self.progress.step + 1, loss=float(total[0]) / max(tokens, 1.0), rows=rows,
                         tokens=int(tokens), seconds=time.perf_counter() - t0,
                         data_wait=self.source.wait_seconds - w0, keys=keys, local_tokens=mine,
                         optimizer_step=stepped)

    def _micro_step(self, input_ids: Any, labels: Any, position_ids: Any, tokens: float) -> tuple[Any, bool]:
        """Forward, backward and DeepSpeed's step of one micro-batch; (loss sum, whether the optimizer stepped).
        The optimizer steps on the last micro-step of every ``grad_accum_steps`` window."""
        device = self.engine.device
        # attention_mask=None + per-document position_ids: block-diagonal causal attention
        out = self.engine(input_ids=input_ids.to(device), position_ids=position_ids.to(device), use_cache=False)
        s = loss_sum(out.logits, labels)
        self.engine.backward(s / max(tokens, 1.0) * self.world)  # DeepSpeed averages over ranks
        before = self.engine.global_steps
        self.engine.step()
        stepped = self.engine.global_steps != before
        self.window = 0 if stepped else self.window + 1
        return s, stepped

    def _close_window(self, t0: float) -> StepStats:
        """The data ended inside an accumulation window: fully masked micro-steps (zero loss, zero gradient)
        on every rank carry it to its boundary, so the optimizer steps on the window's real micro-batches
        (each weighted 1/grad_accum_steps, as in a full window) and no trained sequence is left unstepped."""
        padding = 0
        while self.window:
            input_ids, labels, position_ids, _, self.loads.real = to_tensors(None, self.manifest.seq_len, self.pad_id)
            self._micro_step(input_ids, labels, position_ids, 1.0)
            padding += 1
        log.info("data ended %d micro-steps into an accumulation window of %d: padded it and stepped",
                 self.recipe.grad_accum_steps - padding, self.recipe.grad_accum_steps)
        return StepStats(step=self.progress.step, loss=0.0, rows=0, tokens=0, seconds=time.perf_counter() - t0,
                         data_wait=0.0, optimizer_step=True, padding=padding)

    def after_step(self, stats: StepStats) -> None:
        """Expert balancing, counters, metrics and the keys log."""
        import torch.distributed as dist

        from training.model import balance_stats, update_bias

        if stats.optimizer_step:  # DeepSeek-V3 updates the biases once per optimizer step, from the loads of
            expert = self.loads.take()  # every micro-batch of its window (real tokens only), all ranks
            for c in expert:
                dist.all_reduce(c)
            if self.recipe.bias_update_speed > 0:
                update_bias(self.engine.module, expert, self.recipe.bias_update_speed)
            self.balance = balance_stats(expert)
        if not stats.padding:
            self.progress.update(stats)
            self.metrics.log(stats.step, {
                "loss": stats.loss, "lr": self.engine.get_lr()[0], "tokens_per_s": stats.tokens / stats.seconds,
                "data_wait_fraction": stats.data_wait / stats.seconds, "sequences_done": self.progress.sequences,
                "optimizer_steps": self.engine.global_steps, **self.balance})
            self.window_keys.append((stats.step, stats.keys))
        if stats.optimizer_step:
            self._log_trained_keys()

    def _log_trained_keys(self) -> None:
        """The keys audit log: a window's keys are written once its optimizer step ran (a trainer killed
        inside a window trained none of them: its resume trains them again)."""
        if self.keys_log:
            for step, keys in self.window_keys:
                row = {"step": step, "optimizer_step": self.engine.global_steps,
                       "keys": [k.decode() for k in keys if not k.startswith(b"replay:")]}
                replayed = [k.decode() for k in keys if k.startswith(b"replay:")]  # train.replay's rows, apart
                self.keys_log.write(json.dumps({**row, "replayed": replayed} if replayed else row) + "\n")
            self.keys_log.flush()
        self.window_keys = []

    def checkpoint_due(self, stats: StepStats) -> bool:
        """Only on an optimizer step: between two, the offsets are past batches whose gradients exist only
        in memory, and a resume from there would skip them."""
        return stats.optimizer_step and self.engine.global_steps % self.recipe.checkpoint_every == 0

    def checkpoint(self) -> None:
        """Model, optimizer, scheduler, every rank's offsets and the progress counters; then the
        offsets are committed to the consumer group (the lag sensor sees progress)."""
        slots = {"data": self._data_state(), "progress": self.progress.state_dict()}
        self.data_state = checkpoint.save(self.engine, self.progress.step, self.files.checkpoints, slots=slots,
                                          kafka_config=self.kafka_config, group_id=self.group_id,
                                          keep=self.recipe.keep_checkpoints)
        self.saved_step = self.progress.step

    def _offsets_moved(self) -> bool:
        """Whether any rank's offsets moved since the last checkpoint without a step: reaching the end
        of a partition passes its last transaction markers. The last step being a checkpoint step must
        not leave the group's committed offsets short of the end (its lag would never reach 0)."""
        import torch
        import torch.distributed as dist

        saved = checkpoint.all_offsets(self.data_state) if self.data_state else {}
        moved = any(saved.get(k) != o for k, o in checkpoint.owned_offsets(self.source.state_dict()).items())
        flag = torch.tensor([int(moved)], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def _data_state(self) -> dict[str, Any]:
        """Every rank's data state merged (a collective)."""
        import torch.distributed as dist

        states: list[Any] = [None] * self.world
        dist.all_gather_object(states, self.source.state_dict())
        return checkpoint.merge_states(states)

    def fork_if_due(self) -> None:
        """``wsd``: at the last optimizer step before the cooldown (or a resume there), the trunk: its weights
        as an HF folder, then its checkpoint, then the tag in ``fork.json`` (a kill in between forks again)."""
        import torch.distributed as dist

        from training.schedule import fork_due

        if not fork_due(self.engine.global_steps, self.fork_at, self.files.fork.is_file()):
            return
        if self.engine.global_steps > (self.fork_at or 0):
            log.warning("wsd: resumed at optimizer step %d, past this world size's fork step %d (the night was "
                        "relaunched at another world size): the trunk is the resumed state, trained at the peak LR",
                        self.engine.global_steps, self.fork_at)
        export(self.engine, self.manifest, self.files, target=self.files.trunk)  # every rank (ZeRO-3)
        self.checkpoint()
        if self.rank == 0:
            atomic_write_json(self.files.fork, {"tag": checkpoint_tag(self.progress.step), "step": self.progress.step})
            log.info("wsd: the trunk before the cooldown, optimizer step %d: %s", self.fork_at, self.files.trunk)
        dist.barrier()

    def train(self) -> dict[str, Any]:
        t_start, wait_start = time.perf_counter(), self.source.wait_seconds
        stats: StepStats | None = None
        ended = False
        self.fork_if_due()  # a night of one step forks before it; a resume at the fork finishes it
        while self.window or self.args.max_steps is None or self.progress.step < self.args.max_steps:
            stats = self.train_step()  # --max-steps inside a window: the window is finished first
            if stats is None:
                ended = True
                break
            self.after_step(stats)
            if stats.optimizer_step:
                self.fork_if_due()
            if self.checkpoint_due(stats) and self.saved_step != self.progress.step:
                self.checkpoint()
        if ended:  # the data ended (not --max-steps, 0 included): every sequence of the manifest, exactly
            state = self._data_state()
            self.source.verify(state) if self.mix is not None else verify_consumed(state, self.manifest)
        if self.saved_step != self.progress.step or not self.data_state or self._offsets_moved():
            self.checkpoint()
        return self.finish(time.perf_counter() - t_start, self.source.wait_seconds - wait_start)

    def finish(self, elapsed: float, waited: float) -> dict[str, Any]:
        """The summary (and, on rank 0, the HF export and loss curve); close everything."""
        import torch
        import torch.distributed as dist

        from training.metrics import plot_loss, read_metrics

        exported = export(self.engine, self.manifest, self.files)  # every rank: ZeRO-3 gathers the weights
        waits = torch.tensor([waited], dtype=torch.float64)
        dist.all_reduce(waits)
        per_rank: list[Any] = [None] * self.world  # each rank's peak memory includes the export
        dist.all_gather_object(per_rank, {"rank": self.rank, "partitions": self.source.partitions,
                                          "tokens_this_session": self.progress.rank_tokens,
                                          "parameters_held_at_load": self.held_at_load,
                                          "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024})
        p, f = self.progress, self.files
        replayed = sum(self.data_state.get("replayed", {}).values())  # rows of earlier nights (train.replay)
        summary = {"steps": p.step, "optimizer_steps": self.engine.global_steps,
                   "sequences_this_session": p.session_sequences,
                   "tokens_this_session": p.session_tokens, "sequences_replayed": replayed,
                   "sequences_consumed": p.sequences - replayed,
                   "tokens_consumed": p.tokens,
                   "sequences_published": self.manifest.sequences, "first_loss": p.first_loss,
                   "last_loss": p.last_loss, "data_wait_fraction": float(waits[0]) / self.world / max(elapsed, 1e-9),
                   "checkpoint": str(f.checkpoints), "next_offsets": self.data_state.get("next_offsets"),
                   "world_size": self.world, "ranks": per_rank, "group_id": self.group_id, "topic": self.manifest.topic,
                   "recipe": self.recipe.name, "init_from": self.args.init_from}
        if self.mix is not None:  # the realised mixture beside its targets, per night and per window of steps
            summary["mixture"] = self.source.summary()
            summary["sequences_published"] = sum(m.sequences for m in self.mix.read_manifests().values())
            summary["next_offsets"] = {k: c["next_offsets"] for k, c in self.data_state["components"].items()}
        if self.rank == 0:
            summary["export"] = str(exported)
            rows = read_metrics(f.metrics)
            if rows:
                summary["loss_curve"] = str(plot_loss(rows, f.loss_curve))
            f.summary.write_text(json.dumps(summary, indent=2))
        self.metrics.close()
        self.source.close()
        if self.keys_log:
            self.keys_log.close()
        dist.barrier()
        return summary
