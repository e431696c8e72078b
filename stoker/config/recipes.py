"""Named training recipes: one function per shape of run, each returning a validated TrainRecipe, and
recipes written in YAML (``corpora/recipes/<name>.yaml``) validated by the same dataclasses.

``debug_cpu()`` is the embedded default (a ~2.5M-parameter DeepSeek-V3 that trains on 2 CPU cores);
``small_1gpu()`` and ``multi_8gpu()`` are starting points for real hardware.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stoker.exceptions import ConfigError


@dataclass(kw_only=True, slots=True)
class ModelShape:
    hidden_size: int = 256
    """Width of the residual stream."""
    num_layers: int = 4
    """Transformer blocks; the first ``first_dense_layers`` use a dense MLP, the rest MoE."""
    num_heads: int = 4
    """Attention heads (MLA)."""
    intermediate_size: int = 512
    """Dense MLP width (dense layers)."""
    moe_intermediate_size: int = 128
    """Width of each routed and shared expert."""
    n_routed_experts: int = 8
    """Routed experts per MoE layer."""
    experts_per_token: int = 2
    """Routed experts each token is sent to (top-k)."""
    n_shared_experts: int = 1
    """Always-on experts per MoE layer."""
    first_dense_layers: int = 1
    """Leading layers with a dense MLP instead of MoE (DeepSeek-V3: first_k_dense_replace)."""
    kv_lora_rank: int = 64
    """MLA compressed key/value dimension."""
    q_lora_rank: int | None = None
    """MLA compressed query dimension (None: full-rank queries, as in V2-Lite)."""
    qk_rope_head_dim: int = 16
    """MLA: the part of each query/key head that carries rotary position (RoPE)."""
    qk_nope_head_dim: int = 32
    """MLA: the part of each query/key head without position."""
    v_head_dim: int = 32
    """MLA: width of each value head."""

    def __post_init__(self) -> None:
        if self.experts_per_token > self.n_routed_experts:
            raise ConfigError(f"experts_per_token = {self.experts_per_token}: must be <= n_routed_experts "
                              f"({self.n_routed_experts})")
        if not 0 <= self.first_dense_layers <= self.num_layers:
            raise ConfigError(f"first_dense_layers = {self.first_dense_layers}: must be in [0, num_layers]")


@dataclass(kw_only=True, slots=True)
class TrainRecipe:
    name: str
    """The recipe's name (a YAML recipe: its file name); recorded in every checkpoint and model card."""
    model: ModelShape = field(default_factory=ModelShape)
    micro_batch_size: int = 4
    """Sequences per rank per micro-step."""
    grad_accum_steps: int = 1
    """Micro-steps per optimizer step."""
    lr: float = 1e-3
    """Peak learning rate."""
    min_lr_ratio: float = 0.1
    """The cosine decays to lr * min_lr_ratio."""
    warmup_steps: int = 10
    """Linear warm-up steps (optimizer steps)."""
    weight_decay: float = 0.1
    """AdamW's decoupled weight decay."""
    grad_clip: float = 1.0
    """Gradient-norm clipping."""
    zero_stage: int = 0
    """DeepSpeed ZeRO stage (0-3)."""
    bf16: bool = False
    """bf16 mixed precision (GPUs); fp32 otherwise."""
    torch_adam: bool = True
    """Use torch's AdamW instead of a JIT-compiled fused/CPU Adam (avoids a ~40 s build on CPU)."""
    checkpoint_every: int = 50
    """Optimizer steps between checkpoints (and consumer-group commits); one is also saved at the end."""
    keep_checkpoints: int = 2
    """Checkpoints kept in the trainer's folder, newest first; older ones are removed after each save
    (each holds the model and optimizer: on the real model, hundreds of GB)."""
    bias_update_speed: float = 1e-3
    """DeepSeek-V3 auxiliary-loss-free balancing: gamma in bias += gamma * sign(mean load - load); 0 = off."""
    seed: int = 1234
    """Seeds the model's random init (a line's first night); the data order never depends on it."""
    compile: bool = False
    """``torch.compile`` each decoder layer (training/model.py ``compile_layers``): the first micro-steps compile
    (~20 s a rank on CPU for debug_cpu, minutes on a GPU model), then run the fused kernels. Parameter names,
    checkpoints and the export are unchanged; logits equal the eager model's (tests/integration/test_model_compile.py).
    Not with ZeRO-3, whose per-layer gather hooks break the compiled graphs."""

    def __post_init__(self) -> None:
        for name in ("micro_batch_size", "grad_accum_steps", "checkpoint_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ConfigError(f"recipe {self.name}: {name} = {getattr(self, name)} must be >= 1")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ConfigError(f"recipe {self.name}: zero_stage = {self.zero_stage} must be 0, 1, 2 or 3")
        if not 0 < self.lr < 1:
            raise ConfigError(f"recipe {self.name}: lr = {self.lr} must be in (0, 1)")
        if self.compile and self.zero_stage == 3:
            raise ConfigError(f"recipe {self.name}: compile = true with zero_stage = 3: ZeRO-3 gathers each layer's "
                              "weights in hooks that break the compiled graphs; use zero_stage 0-2 or compile = false")
        if self.bias_update_speed < 0:
            raise ConfigError(f"recipe {self.name}: bias_update_speed = {self.bias_update_speed} must be >= 0")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def debug_cpu() -> TrainRecipe:
    """~2.5M parameters: hidden 128, 2 layers (one dense, one MoE of 8 routed experts top-2 + 1 shared),
    MLA; fp32 on CPU. Small enough that `make run` and the suite train in seconds on 2 cores (a step of
    2 ranks x 4 x 256 tokens is about 2.3 times faster than the earlier hidden-256, 4-layer shape; the
    8192-token vocabulary's head is most of what is left)."""
    return TrainRecipe(name="debug_cpu", checkpoint_every=50,
                       model=ModelShape(hidden_size=128, num_layers=2, intermediate_size=256,
                                        moe_intermediate_size=64, kv_lora_rank=32))


def small_1gpu() -> TrainRecipe:
    """A ~0.5B-parameter start for one 80 GB GPU: bf16, ZeRO-1, fused Adam."""
    return TrainRecipe(
        name="small_1gpu",
        model=ModelShape(hidden_size=1024, num_layers=16, num_heads=16, intermediate_size=2816,
                         moe_intermediate_size=704, n_routed_experts=16, experts_per_token=4,
                         n_shared_experts=1, first_dense_layers=1, kv_lora_rank=256, q_lora_rank=512,
                         qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=64),
        micro_batch_size=8, grad_accum_steps=8, lr=4e-4, warmup_steps=500, zero_stage=1, bf16=True,
        torch_adam=False, checkpoint_every=500,
    )


def multi_8gpu() -> TrainRecipe:
    """A ~3B-parameter start for 8 GPUs on one node: bf16, ZeRO-2."""
    return TrainRecipe(
        name="multi_8gpu",
        model=ModelShape(hidden_size=2048, num_layers=24, num_heads=16, intermediate_size=8192,
                         moe_intermediate_size=1024, n_routed_experts=64, experts_per_token=6,
                         n_shared_experts=2, first_dense_layers=1, kv_lora_rank=512, q_lora_rank=1536,
                         qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128),
        micro_batch_size=4, grad_accum_steps=4, lr=3e-4, warmup_steps=2000, zero_stage=2, bf16=True,
        torch_adam=False, checkpoint_every=1000,
    )


RECIPES = {f.__name__: f for f in (debug_cpu, small_1gpu, multi_8gpu)}


def recipe_files() -> dict[str, Path]:
    """Recipes written in YAML: ``<corpora>/recipes/<name>.yaml``, next to the corpus configs."""
    from stoker import paths

    return {p.stem: p for p in sorted((paths.corpora_dir() / "recipes").glob("*.yaml"))}


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def with_overrides(recipe: TrainRecipe, overrides: dict[str, Any], where: str) -> TrainRecipe:
    """``recipe`` with ``overrides`` (nested like the recipe: ``{"model": {"hidden_size": 512}}``), built and
    validated as a recipe file is: unknown keys, wrong types and bad values fail with the key's name."""
    from stoker.config.schema import build

    try:
        return build(TrainRecipe, _merge(recipe.to_dict(), overrides), "")
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["lr=3e-4", "model.num_layers=8"]`` → ``{"lr": 0.0003, "model": {"num_layers": 8}}`` (YAML values)."""
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: must be KEY=VALUE, e.g. lr=3e-4 or model.num_layers=8")
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = yaml.safe_load(raw)
    return out


def load_recipe_file(path: Path, seen: tuple[str, ...] = ()) -> TrainRecipe:
    """A YAML recipe: the keys of :class:`TrainRecipe` (``model`` as a mapping of :class:`ModelShape`'s),
    plus an optional ``base`` (a built-in or another YAML recipe) whose values it starts from."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: not a readable YAML recipe: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe must be a mapping of recipe keys, got {type(data).__name__}")
    if path.stem in RECIPES:
        raise ConfigError(f"{path}: {path.stem!r} is a built-in recipe's name: name the file otherwise")
    base_name = data.pop("base", None)
    if base_name in seen:
        raise ConfigError(f"{path}: base = {base_name!r} makes a cycle of recipes {[*seen, base_name]}")
    base = get_recipe(str(base_name), (*seen, path.stem)) if base_name is not None else TrainRecipe(name=path.stem)
    return with_overrides(base, {**data, "name": path.stem}, str(path))


def get_recipe(name: str, seen: tuple[str, ...] = ()) -> TrainRecipe:
    """A built-in recipe, or ``<corpora>/recipes/<name>.yaml``."""
    if name in RECIPES:
        return RECIPES[name]()
    files = recipe_files()
    if name in files:
        return load_recipe_file(files[name], seen)
    raise ConfigError(f"train.recipe = {name!r}: no such recipe; built in: {sorted(RECIPES)}; in YAML "
                      f"(corpora/recipes/<name>.yaml): {sorted(files) or 'none'}")
