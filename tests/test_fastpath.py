"""The engine's fast path (stacked multi-LoRA GEMMs, in-place KV cache,
grouped decode attention) gives PEFT's numbers: same greedy tokens, raw
log-probs and forced-choice scores within 1e-4, on the real tiny Qwen3."""
from __future__ import annotations

import pytest
import torch

from lora_triplay.engine import fastgemm, fastpath
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


def test_fast_choice_scores_equal_peft(engines, monkeypatch):
    fast, slow = engines
    choices = ("Label: negative", "Label: rejective", "Label: positive")
    reqs = [Request(a, m, choices=choices) for a in ("evaluator", "base", "blue@1") for m in MSGS]
    served, real_rows = [], fastpath.MultiLora.rows

    def counting_rows(self, index):  # a judge's direct call goes through the fast path, as generate does
        served.append(len(index))
        return real_rows(self, index)

    monkeypatch.setattr(fastpath.MultiLora, "rows", counting_rows)
    fast.model.train()
    for x, y in zip(fast.score_choices(reqs), slow.score_choices(reqs)):
        for px, py in zip(x, y):
            assert max(abs(p - q) for p, q in zip(px, py)) < 1e-4
    assert served and fast.model.training  # served, and the caller's mode given back


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


@pytest.mark.parametrize("mask_kind", ["bool", "float", "none"])
def test_grouped_sdpa_equals_transformers_sdpa_forward_and_backward(mask_kind):
    """Many query tokens on a padded cache (an update's remainder and label
    passes): SDPA's own grouped-query attention gives transformers' numbers
    and gradients, without copying each key/value head per query head."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(0)

    class Module:
        num_key_value_groups = 3
        is_causal = True
        training = True

    B, H, KVH, D, q_len, T = 3, 6, 2, 16, 5, 13
    mask = None
    if mask_kind != "none":
        causal = torch.arange(T)[None, :] <= (T - q_len + torch.arange(q_len))[:, None]
        keep = causal.expand(B, 1, q_len, T).clone()
        keep[0, ..., :4] = False  # a left-padded row
        mask = keep if mask_kind == "bool" else torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
    leaves = [torch.randn(B, H, q_len, D), torch.randn(B, KVH, T, D), torch.randn(B, KVH, T, D)]
    grad = torch.randn(B, q_len, H, D)
    outs = []
    for function in (fastpath.grouped_sdpa, sdpa_attention_forward):
        q, k, v = (t.clone().requires_grad_() for t in leaves)
        out, _ = function(Module(), q, k, v, mask, scaling=D ** -0.5)
        out.backward(grad)
        outs.append((out.detach(), q.grad, k.grad, v.grad))
    for ours, ref in zip(*outs):
        assert ours.shape == ref.shape and torch.allclose(ours, ref, atol=1e-5)


def test_grouped_sdpa_serves_updates_on_the_cpu(tiny_model_dir, monkeypatch):
    """A learner's update attends through grouped_sdpa: SDPA sees the key/value
    heads unrepeated (transformers' own SDPA repeats them under a mask), and
    the update ends on the same weights either way."""
    from lora_triplay.model import activate, attach_role_adapters, load_base
    from lora_triplay.recipe import GrpoConfig, ModelConfig
    from lora_triplay.training.grpo import GrpoLearner
    from lora_triplay.training.supervised import ChoiceExample

    real = torch.nn.functional.scaled_dot_product_attention
    heads: list[tuple[int, int]] = []  # (query heads, key heads) SDPA was given

    def spy(query, key, *args, **kwargs):
        heads.append((query.shape[1], key.shape[1]))
        return real(query, key, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    finals, seen = [], {}
    for grouped in (True, False):
        monkeypatch.setattr(fastpath, "GROUPED_SDPA", grouped)
        heads.clear()
        torch.manual_seed(0)
        base, _, _ = load_base(ModelConfig(base=str(tiny_model_dir), device="cpu", dtype="float32"))
        model = attach_role_adapters(base, LoraConfig(rank=4, alpha=8), seed=0, names=["judge"])
        learner = GrpoLearner(model, activate(model, "judge"), GrpoConfig(max_tokens_per_microbatch=64), lr=1e-2, pad_id=0)
        prompt = list(range(5, 30))
        examples = [ChoiceExample(prompt + [40 + i, 41, 42 + i], [[7, 2], [8, 9, 2]], i % 2) for i in range(4)]
        learner.step([], examples)
        finals.append(torch.cat([p.detach().flatten() for p in learner.params]))
        seen[grouped] = set(heads)
        assert model.config._attn_implementation == "sdpa"  # put back after the update
    assert seen[True] == {(4, 2)}  # the tiny model: 4 query heads on 2 key/value heads, never repeated
    assert (4, 4) in seen[False]  # transformers' SDPA repeated them for the masked passes
    assert torch.allclose(finals[0], finals[1], atol=1e-5)


# ------------------------------------------ the GEMMs (engine/fastgemm.py)

# (ONEDNN, FUSE, LM_HEAD_BLOCK): the fast path as it was, each part alone,
# all together. The tiny model's vocabulary is 1,024: 300-column blocks
# leave a short last block.
SWITCHES = [(False, False, 0), (True, False, 0), (False, True, 0), (False, False, 300), (True, True, 300)]


@pytest.fixture()
def switches(request, monkeypatch):
    onednn, fuse, block = request.param
    if onednn and not fastgemm.onednn_ok():
        pytest.skip("this torch has no oneDNN linear")
    monkeypatch.setattr(fastpath, "ONEDNN", onednn)
    monkeypatch.setattr(fastpath, "FUSE", fuse)
    monkeypatch.setattr(fastpath, "LM_HEAD_BLOCK", block)
    return request.param


@pytest.mark.parametrize("switches", SWITCHES, indirect=True)
def test_each_gemm_path_equals_peft_on_a_mixed_batch(engines, switches):
    fast, slow = engines
    s = Sampling(max_new_tokens=12, temperature=0.0)
    a, b = fast.generate(_requests(), s), slow.generate(_requests(), s)  # 5 adapters (base and a snapshot) in one batch
    for x, y in zip(a, b):
        for cx, cy in zip(x, y):
            assert cx.token_ids == cy.token_ids
            assert max(abs(p - q) for p, q in zip(cx.logprobs, cy.logprobs)) < 1e-4
    choices = ("Label: negative", "Label: positive")
    reqs = [Request(a, m, choices=choices) for a in ("evaluator", "base", "red") for m in MSGS]
    for x, y in zip(fast.score_choices(reqs), slow.score_choices(reqs)):  # lm_head on every position
        for px, py in zip(x, y):
            assert max(abs(p - q) for p, q in zip(px, py)) < 1e-4


def _record(monkeypatch, module, name):
    """Record (storage address, shape) of the weight of every call to module.name."""
    seen, real = [], getattr(module, name)

    def spy(x, weight, bias=None):
        seen.append((weight.data_ptr(), tuple(weight.shape)))
        return real(x, weight, bias)

    monkeypatch.setattr(module, name, spy)
    return seen


def test_fused_and_blocked_gemms_really_run(engines, role_model, monkeypatch):
    """With every switch on, q/k/v and gate/up go through one GEMM each and
    the lm_head through blocks: the weights the GEMMs see say so."""
    if not fastgemm.onednn_ok():
        pytest.skip("this torch has no oneDNN linear")
    model, _ = role_model
    monkeypatch.setattr(fastpath, "LM_HEAD_BLOCK", 300)
    seen = _record(monkeypatch, fastgemm, "_onednn")
    fast, _ = engines
    fast.generate(_requests()[:6], Sampling(max_new_tokens=3, temperature=0.0))
    key = lambda w: (w.data_ptr(), tuple(w.shape))  # noqa: E731
    fused = [g for g in fast._multilora.groups if len(g.members) > 1]
    assert len(fused) == 2 * model.config.num_hidden_layers  # q/k/v and gate/up in every layer
    for g in fused:
        assert key(g.weight) in seen  # the group's one GEMM
        assert not any(key(m.base_layer.weight) in seen for m in g.members)  # no member alone
    head = model.get_base_model().lm_head.weight
    assert key(head[:300]) in seen and key(head[900:]) in seen  # the blocks, the short last one
    assert key(head) not in seen


def test_fused_weights_are_views_not_copies(engines, role_model):
    model, _ = role_model
    fast, _ = engines
    fast.generate(_requests()[:1], Sampling(max_new_tokens=1, temperature=0.0))
    attn = model.base_model.model.model.layers[0].self_attn
    group = next(g for g in fast._multilora.groups if g.members[0] is attn.q_proj)
    assert group.intact() and group.weight.shape[0] == sum(g.base_layer.out_features for g in (attn.q_proj, attn.k_proj, attn.v_proj))
    for m in (attn.q_proj, attn.k_proj, attn.v_proj):  # one storage: the fused tensor
        assert m.base_layer.weight.untyped_storage().data_ptr() == group.weight.untyped_storage().data_ptr()


def test_a_replaced_base_weight_is_fused_again(engines, role_model):
    """Something that swaps a member's storage (a device move, a merge that
    assigns .data) must not leave the fused copy stale."""
    model, _ = role_model
    fast, slow = engines
    s = Sampling(max_new_tokens=8, temperature=0.0)
    fast.generate(_requests()[:1], s)
    k = model.base_model.model.model.layers[0].self_attn.k_proj.base_layer
    with torch.no_grad():
        k.weight.data = k.weight.detach() * 1.5  # a new tensor: the view is gone
    a, b = fast.generate(_requests(), s), slow.generate(_requests(), s)
    assert [c.token_ids for x in a for c in x] == [c.token_ids for x in b for c in x]
    group = next(g for g in fast._multilora.groups if any(m.base_layer is k for m in g.members))
    assert group.intact()


def test_a_sibling_called_alone_computes_itself(engines, role_model):
    """k_proj on an input q_proj did not see (another caller, another
    order): its own GEMM and its own adapter, not a stale slice."""
    model, _ = role_model
    fast, _ = engines
    attn = model.base_model.model.model.layers[0].self_attn
    x = torch.randn(3, attn.k_proj.in_features)
    with torch.no_grad():
        with fast._serve(["red", "__base__"]):
            fast._multilora.rows(torch.tensor([0, 1, 0]))
            attn.q_proj(torch.randn_like(x))
            ours = attn.k_proj(x)
        lora = attn.k_proj.lora_B["red"](attn.k_proj.lora_A["red"](x)) * attn.k_proj.scaling["red"]
        ref = attn.k_proj.base_layer(x) + lora * torch.tensor([1.0, 0.0, 1.0]).unsqueeze(-1)
    assert torch.allclose(ours, ref, atol=1e-5)
    assert "forward" not in attn.k_proj.__dict__  # unpatched after serving


def test_onednn_linear_equals_f_linear_and_leaves_autograd_alone():
    if not fastgemm.onednn_ok():
        pytest.skip("this torch has no oneDNN linear")
    torch.manual_seed(0)
    x, w, b = torch.randn(4, 7, 576), torch.randn(300, 576), torch.randn(300)
    with torch.no_grad():
        assert torch.allclose(fastgemm.linear(x, w, b), torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-4)
    w.requires_grad_(True)
    fastgemm.linear(x, w, b).sum().backward()  # with grad on: F.linear, differentiable
    assert w.grad is not None


def test_released_pages_are_only_a_mapped_files_and_read_back_the_same(tmp_path):
    """The fused copy gives the old weights' pages back only where they map
    a file (a read faults the file's bytes in again), never heap memory."""
    import os
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("madvise on Linux only")
    page = os.sysconf("SC_PAGE_SIZE")
    n = 64 * page // 4
    data = torch.arange(n, dtype=torch.float32)
    path = tmp_path / "w.bin"
    data.numpy().tofile(path)
    mapped = torch.from_file(str(path), shared=False, size=n, dtype=torch.float32)  # MAP_PRIVATE, like safetensors
    assert torch.equal(mapped, data)
    assert fastgemm.release_file_pages([(mapped.data_ptr(), mapped.nbytes)]) >= 60 * page
    assert torch.equal(mapped, data)  # faulted back from the file
    heap = torch.randn(n)
    kept = heap.clone()
    assert fastgemm.release_file_pages([(heap.data_ptr(), heap.nbytes)]) == 0
    assert torch.equal(heap, kept)
