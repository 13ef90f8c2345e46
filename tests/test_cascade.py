"""Cascade attention (engine/cascade.py): the prompts' cache kept one row per
prompt gives the numbers of attending each row's own copy of it, on random
tensors with ragged groups and padding, and through the engine on the tiny
model, rows leaving the batch as they finish."""
from __future__ import annotations

import pytest
import torch

from lora_triplay.engine import cascade, fastpath, hf
from lora_triplay.engine.base import Request, Sampling
from lora_triplay.engine.hf import HFEngine
from lora_triplay.recipe import LoraConfig


class _Layer:
    def __init__(self, keys, values):
        self.keys, self.values = keys, values


class _Cache:
    def __init__(self, keys, values):
        self.layers = [_Layer(keys, values)]


class _Attention:
    num_key_value_groups = 3
    is_causal = True
    layer_idx = 0


def _reference(query, prefix_k, prefix_v, prefix_mask, own_k, own_v, own_mask, owner, scale):
    """decode_attention over [the row's prompt | its own tokens], the prompt copied into every row."""
    keys = torch.cat([prefix_k[owner], own_k], 2)
    values = torch.cat([prefix_v[owner], own_v], 2)
    mask = torch.cat([prefix_mask[owner].bool(), own_mask], 1)[:, None, None, :]
    out, _ = fastpath.decode_attention(_Attention(), query, keys, values, mask, scaling=scale)
    return out


@pytest.mark.parametrize("owner", [[0, 0, 0, 1, 1, 1], [2, 0, 2, 2, 1, 0, 2], [1, 1, 1]])
def test_cascade_equals_attention_over_each_rows_copy(owner):
    torch.manual_seed(0)
    U, KVH, G, D, L, T = 3, 2, 3, 8, 9, 5
    owner = torch.tensor(owner)
    B = len(owner)
    prefix_k, prefix_v = torch.randn(U, KVH, L, D), torch.randn(U, KVH, L, D)
    prefix_mask = torch.ones(U, L, dtype=torch.long)
    prefix_mask[0, :4] = 0  # left padding of a shorter prompt
    prefix_mask[2, :1] = 0
    own_k, own_v = torch.randn(B, KVH, T, D), torch.randn(B, KVH, T, D)
    own_mask = torch.ones(B, T, dtype=torch.bool)
    own_mask[1, 3:] = False  # a row that finished and fed padding since
    own_mask[2, :] = False  # every own token masked: the prompt alone, no NaN
    query = torch.randn(B, KVH * G, 1, D)
    scale = D ** -0.5
    with torch.no_grad():
        ref = _reference(query, prefix_k, prefix_v, prefix_mask, own_k, own_v, own_mask, owner, scale)
        with cascade.Cascade.over(_Cache(prefix_k, prefix_v), prefix_mask, owner) as prompts:
            got, _ = fastpath.decode_attention(_Attention(), query, own_k, own_v, own_mask[:, None, None, :], scaling=scale)
            # rows leave the batch: the cascade follows the kept rows
            kept = torch.tensor([i for i in range(B) if i % 3 != 1])
            prompts.keep(kept)
            got_kept, _ = fastpath.decode_attention(_Attention(), query[kept], own_k[kept], own_v[kept],
                                                    own_mask[kept][:, None, None, :], scaling=scale)
        ref_kept = _reference(query[kept], prefix_k, prefix_v, prefix_mask, own_k[kept], own_v[kept], own_mask[kept],
                              owner[kept], scale)
    assert got.shape == ref.shape == (B, 1, KVH * G, D)
    assert torch.isfinite(got).all() and torch.allclose(got, ref, atol=1e-5)
    assert torch.allclose(got_kept, ref_kept, atol=1e-5)
    assert cascade.active() is None  # left behind by nothing


def test_cascade_refuses_a_query_of_several_tokens():
    prefix = torch.randn(1, 2, 4, 8)
    with cascade.Cascade.over(_Cache(prefix, prefix), torch.ones(1, 4), torch.tensor([0, 0])):
        with pytest.raises(RuntimeError, match="one new token per row"):
            with torch.no_grad():
                fastpath.decode_attention(_Attention(), torch.randn(2, 6, 3, 8), torch.randn(2, 2, 3, 8),
                                          torch.randn(2, 2, 3, 8), None)


MSGS = [
    [{"role": "user", "content": "tell me a story"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a longer question about safety here, with more words"}],
    [{"role": "user", "content": "The quick brown fox jumps over the lazy dog."}],
]


def _rollout(engine, monkeypatch, on: bool, reqs, sampling):
    calls = []
    real = cascade.Cascade.attend

    def counting(self, *args, **kwargs):
        calls.append(len(self.owner))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(hf, "CASCADE", on)
    monkeypatch.setattr(cascade.Cascade, "attend", counting)
    return engine.generate(reqs, sampling), calls


def test_engine_rollouts_with_and_without_cascade_agree(role_model, monkeypatch):
    """Several samples per prompt of several adapters, sampled at
    temperature 1: the same tokens and log-probs (1e-4) with the prompts'
    cache shared as with a copy per row, rows finishing early included
    (an EOS bias on lm_head raised until some do and some do not)."""
    model, tok = role_model
    engine = HFEngine(model, tok, max_batch_size=64, lora=LoraConfig(rank=4, alpha=8))
    reqs = [Request(a, m, n=4) for a in ("base", "blue", "evaluator") for m in MSGS]
    sampling = Sampling(max_new_tokens=12, temperature=1.0, seed=3)
    eos = engine.eos_ids[0]
    head = model.get_output_embeddings()
    head.bias = torch.nn.Parameter(torch.zeros(head.out_features), requires_grad=False)
    try:
        for value in torch.linspace(0.0, 12.0, 25).tolist():
            with torch.no_grad():
                head.bias[eos] = value
            shared, calls = _rollout(engine, monkeypatch, True, reqs, sampling)
            lengths = [len(c.token_ids) for cs in shared for c in cs]
            if sum(n < 8 for n in lengths) >= 9 and sum(n == 12 for n in lengths) >= 4:
                break
        else:
            pytest.fail("no EOS bias made some rows end early and others not")
        copied, none = _rollout(engine, monkeypatch, False, reqs, sampling)
    finally:
        head.bias = None
    assert calls and not none  # the cascade served one rollout and not the other
    assert max(calls) == 36 and min(calls) < 36  # rows left the batch as they finished
    for x, y in zip(shared, copied):
        for a, b in zip(x, y):
            assert a.token_ids == b.token_ids and a.finished == b.finished
            assert max(abs(p - q) for p, q in zip(a.logprobs, b.logprobs)) < 1e-4


def test_one_sample_per_prompt_copies_nothing_and_skips_the_cascade(role_model, monkeypatch):
    model, tok = role_model
    engine = HFEngine(model, tok, max_batch_size=64, lora=LoraConfig(rank=4, alpha=8))
    out, calls = _rollout(engine, monkeypatch, True, [Request("blue", m) for m in MSGS], Sampling(max_new_tokens=6, temperature=0.0))
    assert not calls and all(len(c[0].token_ids) for c in out)
