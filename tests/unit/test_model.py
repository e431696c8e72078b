"""The model side of packing and balancing, on a tiny DeepSeek-V3 (CPU, random init)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the train extra is part of the lock; this guards partial installs

from stoker.config.recipes import ModelShape, TrainRecipe, debug_cpu  # noqa: E402
from stoker.run.records import PackedSequence  # noqa: E402
from training.data.batch import make_batch, position_ids  # noqa: E402
from training.model import ExpertLoad, build_model, routers, update_bias  # noqa: E402

pytestmark = pytest.mark.unit


def _tiny() -> TrainRecipe:
    return TrainRecipe(name="tiny", model=ModelShape(hidden_size=64, num_layers=2, num_heads=2,
                                                      intermediate_size=128, moe_intermediate_size=32,
                                                      kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                                                      v_head_dim=8))


def test_debug_cpu_is_the_tiny_deepseek_v3_of_the_design():
    model = build_model(debug_cpu(), vocab_size=8192, seq_len=256, eos_id=0, pad_id=1)
    n = sum(p.numel() for p in model.parameters())
    assert 2e6 < n < 3e6
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.n_routed_experts, cfg.num_experts_per_tok,
            cfg.n_shared_experts, cfg.kv_lora_rank) == (128, 2, 8, 2, 1, 32)
    assert len(routers(model)) == 1  # the first layer is dense, the other MoE


def test_position_ids_restart_at_every_document():
    assert position_ids(8, np.array([0, 3, 6], dtype="<u4")).tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    assert position_ids(5, np.array([2], dtype="<u4")).tolist() == [0, 1, 0, 1, 2]  # continued doc at 0
    assert position_ids(4, np.array([4], dtype="<u4")).tolist() == [0, 1, 2, 3]  # a start past the inputs


def test_padding_is_never_a_label():
    seq = PackedSequence(tokens=np.array([5, 6, 0, 1, 1, 1], dtype="<u2"), run_id="r",
                         doc_starts=np.array([0], dtype="<u4"), valid=3)
    b = make_batch([seq], [b"k"], seq_len=5)
    assert b.input_ids.tolist() == [[5, 6, 0, 1, 1]]
    assert b.labels.tolist() == [[6, 0, -100, -100, -100]]
    assert b.tokens == 2
    assert b.real.tolist() == [[True, True, True, False, False]]  # 3 real input tokens (the last, EOS, has no label)


def test_expert_loads_count_real_tokens_only():
    """Padding and the fully masked batch of a rank that ran out do not bias DeepSeek-V3's balancing."""
    model = build_model(_tiny(), vocab_size=100, seq_len=32, eos_id=0, pad_id=1).eval()
    loads = ExpertLoad(model)
    k = model.config.num_experts_per_tok
    ids = torch.randint(2, 100, (2, 16), generator=torch.Generator().manual_seed(2))
    real = torch.ones(2, 16, dtype=torch.bool)
    real[1, 5:] = False
    for mask, expected in ((None, 32), (real, 21), (torch.zeros(2, 16, dtype=torch.bool), 0)):
        loads.real = mask
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
        assert [int(c.sum()) for c in loads.take()] == [expected * k] * len(loads.routers)


def test_a_document_packed_with_others_gets_the_logits_it_gets_alone():
    model = build_model(_tiny(), vocab_size=100, seq_len=32, eos_id=0, pad_id=1).eval()
    gen = torch.Generator().manual_seed(0)
    doc_a = torch.randint(2, 100, (10,), generator=gen)
    doc_b = torch.randint(2, 100, (7,), generator=gen)
    with torch.no_grad():
        alone = model(input_ids=doc_a[None], use_cache=False).logits[0]
        packed_ids = torch.cat([doc_b, doc_a])[None]
        pos = torch.from_numpy(position_ids(17, np.array([0, 7], dtype="<u4")))[None]
        packed = model(input_ids=packed_ids, position_ids=pos, attention_mask=None, use_cache=False).logits[0, 7:]
        leaky = model(input_ids=packed_ids, use_cache=False).logits[0, 7:]  # one causal run over both docs
    torch.testing.assert_close(packed, alone, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(leaky, alone, atol=1e-3)  # the test can tell attention that crosses docs


def test_balancing_bias_moves_a_skewed_router_toward_balance():
    model = build_model(_tiny(), vocab_size=100, seq_len=32, eos_id=0, pad_id=1).eval()
    router = routers(model)[0]
    with torch.no_grad():
        router.weight[0] += 0.5  # skew: expert 0 scores high for every token
    loads = ExpertLoad(model)
    ids = torch.randint(2, 100, (4, 32), generator=torch.Generator().manual_seed(1))

    def imbalance() -> float:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
        load = loads.take()[0]
        return float(load.max() / load.mean()), load

    before, load0 = imbalance()
    assert int(load0.argmax()) == 0
    for _ in range(60):
        _, load = imbalance()
        update_bias(model, [load] + [torch.zeros(8, dtype=torch.float64)] * (len(loads.counts) - 1), gamma=0.01)
    after, _ = imbalance()
    assert router.e_score_correction_bias[0] < 0  # the over-loaded expert is now penalised
    assert after < before * 0.8
