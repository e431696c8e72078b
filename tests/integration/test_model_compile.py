"""``recipe.compile``: the compiled decoder layers against Hugging Face's eager ``DeepseekV3ForCausalLM`` on the
same weights, on the CPU (inductor's C++ backend): logits, the loss, every gradient and the experts each token
was routed to, on packed batches with per-document positions, as the trainer feeds them. Tolerances (fp32): logits
and gradients within 1e-4 absolute, the loss within 1e-5 relative; the routing exactly. The compiled model's
state dict is the eager one's, so its export loads in ``transformers`` as is."""

from __future__ import annotations

import pytest

from stoker.config.recipes import get_recipe, with_overrides
from stoker.exceptions import ConfigError

pytestmark = pytest.mark.integration
VOCAB, SEQ_LEN, EOS, PAD = 512, 64, 1, 0


def _batch(seed: int):
    """Two packed rows of several documents each: labels shifted, positions restarting at each document."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    ids, pos = [], []
    for _ in range(2):
        row, p = [], []
        while len(row) < SEQ_LEN + 1:
            n = int(rng.integers(3, 30))
            row += [*rng.integers(2, VOCAB, n).tolist(), EOS]
            p += list(range(n + 1))
        ids.append(row[:SEQ_LEN + 1])
        pos.append(p[:SEQ_LEN])
    t = torch.tensor(ids)
    return t[:, :-1], t[:, 1:], torch.tensor(pos)


def _step(model, loads, seed: int):
    from training.trainer import loss_sum

    input_ids, labels, position_ids = _batch(seed)
    model.zero_grad()
    out = model(input_ids=input_ids, position_ids=position_ids, use_cache=False)
    loss = loss_sum(out.logits, labels) / labels.numel()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), float(loss.detach()), grads, loads.take()


def test_compiled_layers_give_hf_eager_logits_loss_gradients_and_routing(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from training.model import ExpertLoad, build_model, compile_layers

    torch.manual_seed(0)
    recipe = get_recipe("debug_cpu")
    eager = build_model(recipe, VOCAB, SEQ_LEN, EOS, PAD)
    compiled = build_model(recipe, VOCAB, SEQ_LEN, EOS, PAD)
    compiled.load_state_dict(eager.state_dict())
    with torch.no_grad():  # the routers' selection biases as training leaves them, not all zero
        for a, b in zip(eager.modules(), compiled.modules(), strict=True):
            if hasattr(a, "e_score_correction_bias"):
                a.e_score_correction_bias.copy_(torch.randn_like(a.e_score_correction_bias) * 0.01)
                b.e_score_correction_bias.copy_(a.e_score_correction_bias)
    compile_layers(compiled)
    assert list(compiled.state_dict()) == list(eager.state_dict())
    loads_e, loads_c = ExpertLoad(eager), ExpertLoad(compiled)
    for seed in (1, 2):  # the second call runs the compiled graphs without compiling
        logits_e, loss_e, grads_e, routed_e = _step(eager, loads_e, seed)
        logits_c, loss_c, grads_c, routed_c = _step(compiled, loads_c, seed)
        assert torch.allclose(logits_c, logits_e, atol=1e-4, rtol=0), (logits_c - logits_e).abs().max()
        assert loss_c == pytest.approx(loss_e, rel=1e-5)
        assert grads_c.keys() == grads_e.keys()
        worst = max(float((grads_c[n] - grads_e[n]).abs().max()) for n in grads_e)
        assert worst < 1e-4, worst
        assert all(torch.equal(a, b) for a, b in zip(routed_c, routed_e, strict=True))
    compiled.save_pretrained(tmp_path / "export")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "export", local_files_only=True)
    input_ids, _, position_ids = _batch(3)
    with torch.no_grad():
        a = reloaded(input_ids=input_ids, position_ids=position_ids).logits
        b = eager(input_ids=input_ids, position_ids=position_ids).logits
    assert torch.allclose(a, b, atol=1e-5, rtol=0)


def test_compile_with_zero3_is_refused_naming_both():
    with pytest.raises(ConfigError, match="compile = true with zero_stage = 3"):
        with_overrides(get_recipe("debug_cpu"), {"compile": True, "zero_stage": 3}, "test")
