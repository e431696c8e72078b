"""The DeepSeek-V3 model of a recipe, and the auxiliary-loss-free load balancing that transformers
leaves out: DeepSeek-V3 (arXiv 2412.19437, §2.1.2) nudges each routed expert's selection bias after
every step, ``b_i += γ · sign(mean load − load_i)``, so over-loaded experts are picked less."""

from __future__ import annotations

from typing import Any

from stoker.config.recipes import TrainRecipe
from stoker.run.manifest import Manifest


def build_config(recipe: TrainRecipe, vocab_size: int, seq_len: int, eos_id: int, pad_id: int) -> Any:
    from transformers import DeepseekV3Config

    m = recipe.model
    return DeepseekV3Config(
        vocab_size=vocab_size, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
        moe_intermediate_size=m.moe_intermediate_size, num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads, num_key_value_heads=m.num_heads,
        n_routed_experts=m.n_routed_experts, num_experts_per_tok=m.experts_per_token,
        n_shared_experts=m.n_shared_experts, first_k_dense_replace=m.first_dense_layers,
        n_group=1, topk_group=1, kv_lora_rank=m.kv_lora_rank, q_lora_rank=m.q_lora_rank,
        qk_rope_head_dim=m.qk_rope_head_dim, qk_nope_head_dim=m.qk_nope_head_dim, v_head_dim=m.v_head_dim,
        max_position_embeddings=max(seq_len, 128), bos_token_id=eos_id, eos_token_id=eos_id,
        pad_token_id=pad_id, tie_word_embeddings=False, use_cache=False,
    )


def build_model(recipe: TrainRecipe, vocab_size: int, seq_len: int, eos_id: int, pad_id: int) -> Any:
    import torch
    from transformers import DeepseekV3ForCausalLM

    torch.manual_seed(recipe.seed)
    model = DeepseekV3ForCausalLM(build_config(recipe, vocab_size, seq_len, eos_id, pad_id))
    model.config.use_cache = False
    return model


def compile_layers(model: Any) -> Any:
    """``torch.compile`` every decoder layer in place (``nn.Module.compile``: the module is not wrapped, so
    parameter names, state dicts, checkpoints and the export stay those of the eager model). Layer by layer rather
    than the whole model: the embedding, the loss and the trainer's router hooks stay outside the graphs, and all
    layers of one kind share one compiled graph. Shapes are static (every micro-batch is micro_batch x seq_len)."""
    for layer in model.model.layers:
        layer.compile(dynamic=False)
    return model


def routers(model: Any) -> list[Any]:
    """The top-k routers of every MoE layer (each holds ``e_score_correction_bias``)."""
    return [m for m in model.modules() if hasattr(m, "e_score_correction_bias")]


class ExpertLoad:
    """Counts, per MoE layer, how many real tokens each routed expert received (forward hooks on
    routers). ``real`` (bool, one per input token, set before each forward) leaves out padding and
    the fully masked batch of a rank that ran out of data."""

    def __init__(self, model: Any) -> None:
        import torch

        self.routers = routers(model)
        self.counts = [torch.zeros(r.e_score_correction_bias.numel(), dtype=torch.float64) for r in self.routers]
        self.real: Any = None
        self._hooks = [r.register_forward_hook(self._hook(i)) for i, r in enumerate(self.routers)]

    def _hook(self, i: int):
        import torch

        def hook(_module: Any, _inputs: Any, output: Any) -> None:
            topk_indices = output[-1].detach()
            if self.real is not None and self.real.numel() == topk_indices.shape[0]:
                topk_indices = topk_indices[self.real.reshape(-1).to(topk_indices.device)]
            self.counts[i] += torch.bincount(topk_indices.reshape(-1).cpu(),
                                             minlength=self.counts[i].numel()).double()
        return hook

    def take(self) -> list[Any]:
        """The counts since the last take (and reset them)."""
        out = [c.clone() for c in self.counts]
        for c in self.counts:
            c.zero_()
        return out

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()


def update_bias(model: Any, loads: list[Any], gamma: float) -> None:
    """One auxiliary-loss-free balancing step per MoE layer: ``b += γ·sign(mean(load) − load)``.

    ``loads`` must be the same on every rank (all-reduced), so the biases stay identical everywhere.
    """
    import torch

    with torch.no_grad():
        for router, load in zip(routers(model), loads, strict=True):
            bias = router.e_score_correction_bias
            step = gamma * torch.sign(load.mean() - load)
            bias.add_(step.to(bias.dtype).to(bias.device))


def balance_stats(loads: list[Any]) -> dict[str, float]:
    """max/mean load over experts (1.0 = perfectly balanced), worst layer and average."""
    ratios = [float(load.max() / load.mean()) for load in loads if float(load.sum()) > 0]
    if not ratios:
        return {"expert_load_max_over_mean": 1.0, "expert_load_max_over_mean_worst": 1.0}
    return {"expert_load_max_over_mean": sum(ratios) / len(ratios), "expert_load_max_over_mean_worst": max(ratios)}


def special_ids(manifest: Manifest) -> tuple[int, int]:
    """(EOS, PAD) as the packer used them: from the manifest. A manifest of an earlier Stoker has none:
    the defaults of the corpus config are looked up in its tokenizer, and one that is missing is an
    error (never a silent id 0)."""
    if manifest.eos_id >= 0 and manifest.pad_id >= 0:
        return manifest.eos_id, manifest.pad_id
    from tokenizers import Tokenizer

    from stoker.config.corpus import TokenizerConfig
    from stoker.exceptions import StokerError

    tok, defaults = Tokenizer.from_file(manifest.tokenizer_path), TokenizerConfig(path="defaults.json")
    eos, pad = tok.token_to_id(defaults.eos_token), tok.token_to_id(defaults.pad_token)
    if eos is None or pad is None:
        raise StokerError(f"{manifest.run_id}: the manifest records no EOS/PAD ids and the tokenizer "
                          f"{manifest.tokenizer_path} has no {defaults.eos_token!r}/{defaults.pad_token!r}: "
                          "re-run tokenize_publish for the date, so the manifest carries the ids it packed with")
    return int(eos), int(pad)
