"""The GRPO forward under every memory setting gives the naive forward's
log-probs and gradient: chunked log-probs, the shared-prompt and the
full-sequence layouts, gradient checkpointing, token-budget micro-batches,
and the fused-kernel self-check."""
from __future__ import annotations

import pytest
import torch

from lora_triplay.errors import UserError
from lora_triplay.model import activate
from lora_triplay.recipe import GrpoConfig
from lora_triplay.training.forward import (
    FULL,
    SHARED,
    Rows,
    choose_layout,
    completion_logprobs,
    decoder_and_head,
    pack,
    padded_tokens,
)
from lora_triplay.training.grpo import GrpoLearner, Sample
from lora_triplay.training.logprobs import LogprobComputer, chunked_logprobs
from tests.reference import naive_logprobs

TOL = 1e-5


SYSTEM = "You are a careful assistant. Refuse what is unsafe and offer safe guidance instead. "


def _samples(tok, shared_system: bool = False):
    """Two groups of three with different prompt and completion lengths,
    advantages of both signs; with `shared_system`, both prompts start with
    the same long prefix (the shared-prefix pass)."""
    head = SYSTEM if shared_system else ""
    p1, p2 = tok.encode(head + "hello there friend"), tok.encode(head + "a much longer prompt about something else")
    texts = ("yes indeed", "no", "maybe so then, perhaps")
    advs = (1.0, -0.5, -0.5, 0.3, 0.9, -1.2)
    out = []
    for g, p in enumerate((p1, p2)):
        for j, t in enumerate(texts):
            out.append(Sample(p, tok.encode(t), g, 0.0, advantage=advs[3 * g + j]))
    return out


class Capped(torch.nn.Module):
    """A head that is not a plain nn.Linear: takes the checkpointed path."""

    def __init__(self, linear):
        super().__init__()
        self.linear = linear

    def forward(self, x):
        return self.linear(x)


@pytest.mark.parametrize("kind", ["linear", "linear+bias+trainable", "wrapped", "softcap"])
def test_chunked_logprobs_equal_the_full_log_softmax(kind):
    torch.manual_seed(0)
    linear = torch.nn.Linear(16, 301, bias="bias" in kind)
    linear.weight.requires_grad_("trainable" in kind)
    head = Capped(linear) if kind == "wrapped" else linear
    transform = (lambda z: torch.tanh(z / 3.0) * 3.0) if kind == "softcap" else None
    hidden = torch.randn(37, 16, requires_grad=True)
    targets = torch.randint(0, 301, (37,))
    weights = torch.linspace(-1, 2, 37)
    z = head(hidden) if transform is None else transform(head(hidden))
    full = torch.log_softmax(z, -1)
    ref = full.gather(-1, targets[:, None]).squeeze(-1)
    ref_ent = -(full.exp() * full).sum(-1)
    wrt = [hidden] + ([linear.weight] + ([linear.bias] if linear.bias is not None else []) if "trainable" in kind else [])
    g_ref = torch.autograd.grad((ref * weights).sum(), wrt)
    for chunk in (1, 5, 37, 100):  # including sizes that do not divide N
        got, ent = chunked_logprobs(hidden, head, targets, chunk_tokens=chunk, with_entropy=True, transform=transform)
        assert torch.allclose(got, ref, atol=TOL) and torch.allclose(ent, ref_ent, atol=1e-4)
        g = torch.autograd.grad((got * weights).sum(), wrt)
        for a, b in zip(g, g_ref):
            assert torch.allclose(a, b, atol=TOL)


def test_chunked_logprobs_check_shapes():
    head = torch.nn.Linear(4, 7, bias=False)
    with pytest.raises(ValueError, match=r"hidden \(N, H\)"):
        chunked_logprobs(torch.randn(2, 3, 4), head, torch.zeros(2, dtype=torch.long))


@pytest.mark.parametrize("layout,shared_system", [(SHARED, False), (SHARED, True), (FULL, False), (FULL, True)])
def test_layouts_equal_the_naive_forward_and_its_gradient(role_model, layout, shared_system):
    from lora_triplay.training.forward import common_prefix

    model, tok = role_model
    params = activate(model, "red")
    samples = _samples(tok, shared_system)
    assert (common_prefix([s.prompt_ids for s in samples[::3]]) > 0) == shared_system
    model.train()
    naive, _, cmask = naive_logprobs(model, samples, tok.pad_token_id)
    naive.sum().backward()
    g_naive = [p.grad.clone() for p in params]
    model.zero_grad()
    out = completion_logprobs(model, samples, tok.pad_token_id, layout, LogprobComputer("chunked", chunk_tokens=4))
    assert torch.equal(out.cmask, cmask)
    assert torch.allclose(out.logp, naive, atol=TOL)
    out.logp.sum().backward()
    for g, p in zip(g_naive, params):
        assert torch.allclose(p.grad, g, atol=TOL, rtol=1e-4)
    model.zero_grad()
    model.eval()


@pytest.fixture()
def checkpointed(role_model):
    model, tok = role_model
    model.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    yield model, tok
    model.base_model.model.gradient_checkpointing_disable()


def test_checkpointing_forces_the_full_sequence_layout(checkpointed):
    model, _ = checkpointed
    model.train()
    assert choose_layout(model) == FULL
    with pytest.raises(ValueError, match="gradient checkpointing"):
        choose_layout(model, SHARED)
    model.eval()
    assert choose_layout(model) == SHARED  # no backward, no checkpointing: the cache survives


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "token_mean"])
def test_checkpointed_gradient_equals_the_plain_one(role_model, loss_type):
    """Same step, same samples: gradient checkpointing on (full-sequence
    layout) vs off (shared-prompt layout), KL term included."""
    model, tok = role_model
    samples = _samples(tok)
    cfg = GrpoConfig(loss_type=loss_type, beta=0.1, max_new_tokens=8, logprob_chunk_tokens=3)
    learner = GrpoLearner(model, activate(model, "blue"), cfg, lr=1e-3, pad_id=tok.pad_token_id)
    plain = learner.gradients(samples)
    assert learner.layout == SHARED
    computer = LogprobComputer("chunked", chunk_tokens=3)
    model.train()
    plain_logp = completion_logprobs(model, samples, tok.pad_token_id, SHARED, computer).logp.detach()
    model.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    try:
        ckpt_logp = completion_logprobs(model, samples, tok.pad_token_id, choose_layout(model), computer).logp.detach()
        ckpt = learner.gradients(samples)
        assert learner.layout == FULL
    finally:
        model.base_model.model.gradient_checkpointing_disable()
        model.eval()
    assert torch.allclose(plain_logp, ckpt_logp, atol=TOL)
    assert any(g.abs().max() > 1e-4 for g in plain)
    for a, b in zip(plain, ckpt):
        assert torch.allclose(a, b, atol=TOL, rtol=1e-4)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "token_mean"])
@pytest.mark.parametrize("forward", ["shared_prompt", "full_sequence"])
def test_token_budget_microbatches_do_not_change_the_gradient(role_model, loss_type, forward):
    model, tok = role_model
    samples = _samples(tok)
    grads = {}
    for budget in (None, 24):
        cfg = GrpoConfig(loss_type=loss_type, beta=0.05, max_new_tokens=8, forward=forward, max_tokens_per_microbatch=budget)
        learner = GrpoLearner(model, activate(model, "red"), cfg, lr=1e-3, pad_id=tok.pad_token_id)
        grads[budget] = learner.gradients(samples)
    parts = pack(samples, forward, 24)
    assert len(parts) > 2  # the budget really cut the batch
    for a, b in zip(grads[None], grads[24]):
        assert torch.allclose(a, b, atol=TOL, rtol=1e-4)


def test_pack_respects_the_budget_and_keeps_groups_whole():
    rows = [Sample([1] * 10, [2] * c, g, 0.0) for g, c in ((0, 5), (0, 7), (0, 3), (1, 20), (1, 2), (2, 1))]
    rows.insert(4, Sample([3] * 4, [2] * 6, 3, 0.0))
    for layout in (SHARED, FULL):
        for budget in (30, 60, 1000):
            parts = pack(rows, layout, budget)
            assert sorted(i for p in parts for i in p) == list(range(len(rows)))
            for p in parts:
                assert len(p) == 1 or padded_tokens([rows[i] for i in p], layout) <= budget
            assert pack(rows, layout, budget) == parts  # deterministic: every update sees the same micro-batches
    # shared prompt, room for a group: its rows stay together (prompt once)
    parts = pack(rows, SHARED, 60)
    group0 = {0, 1, 2}
    assert any(group0 <= set(p) for p in parts)
    # grad_accumulation asks for at least that many micro-batches
    assert len(pack(rows, FULL, None, min_parts=4)) >= 4


def test_padded_tokens_counts_what_the_shared_prompt_forward_runs(role_model):
    """The shared prefix once, each prompt's remainder padded to the widest,
    each completion padded: the tokens _shared_hidden feeds the decoder
    (counted by a spy on the decoder), so a micro-batch budget means tokens
    run. Every prompt whole would count the 40-token prefix three times."""
    model, tok = role_model
    prefix = [5 + (i % 50) for i in range(40)]
    rows = [Rows(prefix + [60, 61], [7, 8, 2]), Rows(prefix + [62, 63, 64, 65], [9, 2]),
            Rows(prefix + [66], [7, 2]), Rows(prefix + [66], [7, 8, 9, 2])]
    want = 40 + 3 * 4 + 4 * 4
    assert padded_tokens(rows, SHARED) == want  # counted whole, each distinct prompt: 3 x 44 + 4 x 4
    decoder, _ = decoder_and_head(model)
    seen = []
    hook = decoder.register_forward_pre_hook(lambda mod, args, kwargs: seen.append(kwargs["input_ids"].numel()), with_kwargs=True)
    try:
        with torch.no_grad():
            completion_logprobs(model, rows, tok.pad_token_id, SHARED, LogprobComputer("chunked", chunk_tokens=64))
    finally:
        hook.remove()
    # prefix, remainders, then completions but their last token (it predicts nothing)
    assert sum(seen) == want - 4


def test_fused_kernel_is_used_only_if_it_agrees(role_model):
    model, tok = role_model
    _, head = decoder_and_head(model)
    hidden = torch.randn(20, head.in_features)
    targets = torch.randint(0, head.out_features, (20,))

    def exact(h, lm_head, t):  # a "fused" kernel that computes the right thing
        return torch.log_softmax(lm_head(h).float(), -1).gather(-1, t[:, None]).squeeze(-1)

    def wrong(h, lm_head, t):  # gradient off by a factor of 2
        return 2 * exact(h, lm_head, t) - exact(h, lm_head, t).detach()

    good = LogprobComputer("liger", fused=exact)
    good(hidden, head, targets)
    assert good.active == "liger"
    bad = LogprobComputer("liger", fused=wrong)
    logp, _ = bad(hidden, head, targets)
    assert bad.active == "chunked"
    assert torch.allclose(logp, exact(hidden, head, targets), atol=TOL)
    assert LogprobComputer("auto").kernel == "auto"
    auto = LogprobComputer("auto")
    auto(hidden, head, targets)
    assert auto.active == "chunked"  # CPU: no fused kernel


def test_liger_on_cpu_is_a_clear_error(role_model):
    model, _ = role_model
    _, head = decoder_and_head(model)
    with pytest.raises(UserError, match="grpo.logprob_kernel"):
        LogprobComputer("liger")(torch.randn(3, head.in_features), head, torch.zeros(3, dtype=torch.long))
