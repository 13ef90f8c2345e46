"""The engine's fast path (stacked multi-LoRA GEMMs, in-place KV cache,
grouped decode attention) gives PEFT's numbers: same greedy tokens, raw
log-probs and forced-choice scores within 1e-4, on the real tiny Qwen3."""
from __future__ import annotations

import pytest
import torch

from lora_triplay.engine import fastpath
from lora_triplay.engine.base import Request, Sampling
from lora_triplay.engine.hf import HFEngine
from lora_triplay.recipe import LoraConfig

MSGS = [
    [{"role": "user", "content": "tell me a story"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a longer question about safety here, with more words"}],
    [{"role": "user", "content": "The quick brown fox jumps over the lazy dog."}],
]


@pytest.fixture()
def engines(role_model, tmp_path):
    from lora_triplay.core.store import atomic_write
    from lora_triplay.model import save_adapter

    model, tok = role_model
    fast = HFEngine(model, tok, lora=LoraConfig(rank=4, alpha=8))
    slow = HFEngine(model, tok, lora=LoraConfig(rank=4, alpha=8))
    slow.fast = False
    save_adapter(model, "blue", tmp_path / "snap", "tiny", atomic_write)
    fast.load_adapter("blue@1", str(tmp_path / "snap"))  # a snapshot: a fifth adapter in the stack
    return fast, slow


def _requests():
    return [Request(a, m, n=2) for a in ("base", "red", "blue", "evaluator", "blue@1") for m in MSGS]


def test_fast_generate_equals_peft(engines):
    fast, slow = engines
    s = Sampling(max_new_tokens=12, temperature=0.0)
    a, b = fast.generate(_requests(), s), slow.generate(_requests(), s)
    assert len({str(x[0].token_ids) for x in a}) > 3  # adapters really differ
    for x, y in zip(a, b):
        for cx, cy in zip(x, y):
            assert cx.token_ids == cy.token_ids
            assert max(abs(p - q) for p, q in zip(cx.logprobs, cy.logprobs)) < 1e-4


def test_fast_choice_scores_equal_peft(engines):
    fast, slow = engines
    choices = ("Label: negative", "Label: rejective", "Label: positive")
    reqs = [Request(a, m, choices=choices) for a in ("evaluator", "base", "blue@1") for m in MSGS]
    for x, y in zip(fast.score_choices(reqs), slow.score_choices(reqs)):
        for px, py in zip(x, y):
            assert max(abs(p - q) for p, q in zip(px, py)) < 1e-4


def test_sampled_rollouts_equal_peft_with_the_same_seed(engines):
    fast, slow = engines
    s = Sampling(max_new_tokens=10, temperature=1.0, top_p=0.9, seed=5)
    a, b = fast.generate(_requests(), s), slow.generate(_requests(), s)
    assert [c.token_ids for x in a for c in x] == [c.token_ids for x in b for c in x]


def test_fast_path_leaves_the_model_as_it_was(engines, role_model):
    model, _ = role_model
    fast, _ = engines
    before = model.config._attn_implementation
    fast.generate(_requests()[:3], Sampling(max_new_tokens=3, temperature=0.0))
    assert model.config._attn_implementation == before
    assert not any(m._forward_hooks for m in model.modules())
    assert not model.base_model.model.model.layers[0].self_attn.q_proj.disable_adapters


def test_reserved_cache_grows_past_its_reservation(role_model):
    model, _ = role_model
    cache = fastpath.reserved_cache(model, capacity=4)
    k = torch.randn(2, 2, 3, 8)
    cache.update(k, k + 1, 0)
    for step in range(5):  # 3 + 5 > 4: must grow without losing what it holds
        cache.update(k[:, :, :1] * step, k[:, :, :1] * step, 0)
    keys = cache.layers[0].keys
    assert keys.shape[2] == 8 and torch.equal(keys[:, :, :3], k)
    assert torch.equal(keys[:, :, 3 + 4], k[:, :, 0] * 4)
    cache.batch_select_indices(torch.tensor([1, 1, 0]))
    assert cache.layers[0].keys.shape[0] == 3 and torch.equal(cache.layers[0].keys[2], keys[0])


@pytest.mark.parametrize("masked", [False, True])
def test_decode_attention_equals_sdpa(masked):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(0)

    class Module:
        num_key_value_groups = 3
        is_causal = True

    B, H, KVH, D, T = 3, 6, 2, 16, 11
    q, k, v = torch.randn(B, H, 1, D), torch.randn(B, KVH, T, D), torch.randn(B, KVH, T, D)
    mask = None
    if masked:
        mask = torch.ones(B, 1, 1, T, dtype=torch.bool)
        mask[0, ..., :4] = False
    with torch.no_grad():
        ours, _ = fastpath.decode_attention(Module(), q, k, v, mask, scaling=D ** -0.5)
        ref, _ = sdpa_attention_forward(Module(), q, k, v, mask, scaling=D ** -0.5)
    assert torch.allclose(ours, ref, atol=1e-5)
