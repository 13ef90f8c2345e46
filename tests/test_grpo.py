"""GRPO maths with hand-computed values, and one real update on the tiny model."""
from __future__ import annotations

import math

import pytest
import torch

from lora_triplay.core.distributed import Collective
from lora_triplay.model import activate, adapter_parameters
from lora_triplay.recipe import GrpoConfig
from lora_triplay.training.advantages import group_advantages
from lora_triplay.training.grpo import GrpoLearner, Sample

EPS = 1e-4


def test_group_advantages_hand_computed():
    # group 0: rewards 1, 2, 3 -> mean 2, unbiased std 1 -> -1, 0, +1 (over 1 + eps)
    # group 1: rewards 5, 5 -> std 0 -> all zero
    adv = group_advantages([1.0, 2.0, 3.0, 5.0, 5.0], [0, 0, 0, 1, 1])
    assert adv[:3] == pytest.approx([-1 / (1 + EPS), 0.0, 1 / (1 + EPS)])
    assert adv[3:] == [0.0, 0.0]


def test_group_advantages_unscaled_and_dropped():
    # Dr. GRPO: mean removed only.
    assert group_advantages([0.0, 1.0, 5.0], [0, 0, 0], scale=False) == pytest.approx([-2.0, -1.0, 3.0])
    # A dropped sample gets 0 and stays out of its group's statistics:
    # remaining 1, 3 -> mean 2, std sqrt(2).
    adv = group_advantages([None, 1.0, 3.0], [0, 0, 0])
    assert adv == pytest.approx([0.0, -1 / (math.sqrt(2) + EPS), 1 / (math.sqrt(2) + EPS)])
    # A group of one has no baseline to compare with.
    assert group_advantages([7.0], [3]) == [0.0]


@pytest.mark.parametrize("loss_type,expected", [
    # lengths 2 and 4, n = 2, max_new_tokens = 8
    ("grpo", [1 / (2 * 2), 1 / (2 * 4)]),
    ("token_mean", [1 / 6, 1 / 6]),
    ("dr_grpo", [1 / (2 * 8), 1 / (2 * 8)]),
])
def test_loss_normalisers(loss_type, expected):
    cfg = GrpoConfig(loss_type=loss_type, max_new_tokens=8)
    learner = GrpoLearner.__new__(GrpoLearner)
    learner.cfg, learner.max_new_tokens, learner.collective = cfg, cfg.max_new_tokens, Collective(world=1)
    assert learner._normaliser([2, 4]) == pytest.approx(expected)


def _samples(tok, advantages):
    prompt = tok.encode("hello there")
    return [Sample(prompt, tok.encode(text), group=0, reward=0.0, advantage=a)
            for text, a in zip(["yes indeed", "no way at all", "maybe"], advantages)]


def test_step_updates_only_the_active_adapter(role_model):
    model, tok = role_model
    params = activate(model, "blue")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    learner = GrpoLearner(model, params, GrpoConfig(lr=1e-2, beta=0.05), lr=1e-2, pad_id=tok.pad_token_id)
    stats = learner.step(_samples(tok, [1.0, -0.5, -0.5]))
    assert not stats.skipped and stats.tokens > 0 and stats.grad_norm > 0
    blue = set(adapter_parameters(model, "blue"))
    for name, p in model.named_parameters():
        if name in blue:
            assert not torch.equal(p, before[name]), f"{name} did not change"
        else:
            assert torch.equal(p, before[name]), f"{name} changed but is not blue's"


def test_grpo_loss_value_at_ratio_one(role_model):
    # beta = 0 and one update: ratio = 1, so the grpo loss is -mean_i(A_i)
    # (each sequence's token mean of A_i is A_i).
    model, tok = role_model
    params = activate(model, "red")
    learner = GrpoLearner(model, params, GrpoConfig(beta=0.0), lr=1e-6, pad_id=tok.pad_token_id)
    stats = learner.step(_samples(tok, [0.9, -0.3, 0.3]))
    assert stats.loss == pytest.approx(-(0.9 - 0.3 + 0.3) / 3, abs=1e-6)
    assert stats.kl == pytest.approx(0.0, abs=1e-7)  # beta 0: KL not computed


def test_kl_to_base_is_positive_when_adapter_differs(role_model):
    model, tok = role_model
    params = activate(model, "evaluator")
    learner = GrpoLearner(model, params, GrpoConfig(beta=0.1), lr=1e-6, pad_id=tok.pad_token_id)
    stats = learner.step(_samples(tok, [0.0, 0.0, 0.0]))
    assert stats.kl > 1e-4  # random B: the adapter's policy is not the base's


@pytest.mark.parametrize("loss_type", ["grpo", "token_mean", "dr_grpo"])
def test_a_dropped_sample_leaves_the_gradient_as_without_it(role_model, loss_type):
    """Reward None (a malformed judge output) drops the sample: the gradient
    is the one of the batch without it, in every normaliser, KL on."""
    model, tok = role_model
    params = activate(model, "blue")
    learner = GrpoLearner(model, params, GrpoConfig(loss_type=loss_type, beta=0.1), lr=1e-2, pad_id=tok.pad_token_id)
    kept = _samples(tok, [1.0, -0.5, -0.5])
    dropped = Sample(tok.encode("hello there"), tok.encode("a judge said nothing useful"), group=0, reward=None, advantage=0.0)
    alone = learner.gradients(kept)
    with_dropped = learner.gradients([*kept, dropped])
    assert any(g.abs().sum() > 0 for g in alone)
    for a, b in zip(alone, with_dropped):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)
    assert learner.step([dropped]).skipped  # nothing left to learn from


def test_non_finite_step_is_skipped_and_weights_kept(role_model):
    model, tok = role_model
    params = activate(model, "red")
    with torch.no_grad():
        params[0].view(-1)[0] = float("nan")
    before = [p.detach().clone() for p in params]
    learner = GrpoLearner(model, params, GrpoConfig(), lr=1e-2, pad_id=tok.pad_token_id)
    stats = learner.step(_samples(tok, [1.0, -1.0, 0.0]))
    assert stats.skipped and learner.nonfinite_in_a_row == 1
    for p, b in zip(params, before):
        assert torch.equal(torch.nan_to_num(p), torch.nan_to_num(b))


def test_a_nan_after_an_applied_update_keeps_it_and_the_step(role_model, monkeypatch):
    """With several updates per batch, a NaN in a later one must not mark the
    step skipped: the first update already changed the adapter, and a
    skipped step is not synced to the engine (vLLM would serve the old one)."""
    model, tok = role_model
    params = activate(model, "blue")
    before = [p.detach().clone() for p in params]
    learner = GrpoLearner(model, params, GrpoConfig(updates_per_batch=3, beta=0.0), lr=1e-2, pad_id=tok.pad_token_id)
    real, calls = torch.nn.utils.clip_grad_norm_, []

    def nan_on_second(*a, **k):
        calls.append(real(*a, **k))
        return torch.tensor(float("nan")) if len(calls) == 2 else calls[-1]

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", nan_on_second)
    stats = learner.step(_samples(tok, [1.0, -0.5, -0.5]))
    assert len(calls) == 2 and not stats.skipped and stats.extra["nonfinite_at_update"] == 1.0
    assert learner.nonfinite_in_a_row == 0 and learner.updates_done() == 1
    assert any(not torch.equal(p, b) for p, b in zip(params, before)) and all(torch.isfinite(p).all() for p in params)


def test_several_updates_per_batch_clip(role_model):
    model, tok = role_model
    params = activate(model, "blue")
    learner = GrpoLearner(model, params, GrpoConfig(updates_per_batch=4, clip_epsilon=0.01, beta=0.0), lr=5e-2, pad_id=tok.pad_token_id)
    stats = learner.step(_samples(tok, [1.0, -1.0, 0.0]))
    assert not stats.skipped
    # The first (reported) pass is on-policy: ratio 1, nothing clipped; by the
    # last pass the policy has moved beyond 1 +- 0.01 on some tokens.
    assert stats.clip_fraction == 0.0
    assert stats.extra["clip_fraction_last_update"] > 0.0


@pytest.mark.parametrize("loss_type", ["grpo", "token_mean", "dr_grpo"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_one_step_raises_the_rewarded_completion_and_lowers_the_punished(role_model, loss_type, checkpointing):
    """The sign of the whole update: after one on-policy step, the completion
    with a positive advantage is more likely and the one with a negative
    advantage less likely, whichever normaliser and forward layout runs."""
    from reference import naive_logprobs

    model, tok = role_model
    params = activate(model, "blue")
    saved = [p.detach().clone() for p in params]
    prompt = tok.encode("tell me a story")
    samples = [Sample(prompt, tok.encode("once upon a time"), group=0, reward=1.0, advantage=1.0),
               Sample(prompt, tok.encode("no thanks"), group=0, reward=0.0, advantage=-1.0)]

    def sequence_logps():
        with torch.no_grad():
            logp, _, cmask = naive_logprobs(model, samples, tok.pad_token_id)
        return (logp * cmask).sum(-1)

    try:
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        before = sequence_logps()
        learner = GrpoLearner(model, params, GrpoConfig(loss_type=loss_type, beta=0.0, max_new_tokens=8), lr=1e-3, pad_id=tok.pad_token_id)
        stats = learner.step(samples)
        after = sequence_logps()
    finally:
        if checkpointing:
            model.gradient_checkpointing_disable()
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)
    assert not stats.skipped
    assert after[0] > before[0] + 1e-4, (loss_type, before, after)
    assert after[1] < before[1] - 1e-4, (loss_type, before, after)
