"""A reward with real signal: advantage scaling and minimum spread, flat
groups and truncated completions out of the loss, the clamped KL, the
learning-rate warmup, and an end-to-end sign test of blue's reward through
a whole run (tiny model, scripted judge)."""
from __future__ import annotations

import math

import pytest
import torch

from lora_triplay.model import activate
from lora_triplay.recipe import GrpoConfig
from lora_triplay.training.advantages import Sample, assign_advantages, group_advantages
from lora_triplay.training.grpo import GrpoLearner

EPS = 1e-4


def test_batch_scaling_divides_by_the_whole_batch_std():
    rewards, groups = [0.0, 2.0, 10.0, 14.0], [0, 0, 1, 1]
    batch_std = torch.tensor(rewards).std().item()  # unbiased, as TRL's
    adv = group_advantages(rewards, groups, "batch")
    assert adv == pytest.approx([-1 / (batch_std + EPS), 1 / (batch_std + EPS), -2 / (batch_std + EPS), 2 / (batch_std + EPS)])
    assert group_advantages(rewards, groups, "none") == pytest.approx([-1.0, 1.0, -2.0, 2.0])
    assert group_advantages(rewards, groups, True) == group_advantages(rewards, groups, "group")  # the old spelling


def test_a_group_below_the_minimum_spread_has_no_signal():
    """Soft labels 1e-3 apart: +-0.7 advantages without a minimum spread, none with it."""
    rewards, groups = [0.500, 0.501, 0.0, 1.0], [0, 0, 1, 1]
    assert max(abs(a) for a in group_advantages(rewards, groups)[:2]) > 0.6
    adv = group_advantages(rewards, groups, min_std=0.01)
    assert adv[:2] == [0.0, 0.0] and adv[2] < 0 < adv[3]


def test_the_step_diagnostics():
    cfg = GrpoConfig(min_reward_std=0.01)
    samples = [Sample([1], [2], 0, 1.0, kind="harmful"), Sample([1], [3], 0, 1.0, kind="harmful", truncated=True),
               Sample([1], [2], 1, 0.0, kind="benign"), Sample([1], [3], 1, 1.0, kind="benign")]
    metrics = assign_advantages(samples, cfg)
    assert metrics["frac_zero_std"] == 0.5 and metrics["clipped_ratio"] == 0.25
    assert metrics["adv_abs_harmful"] == 0.0 and metrics["adv_abs_benign"] == pytest.approx(0.5 / (math.sqrt(0.5) + EPS))
    assert [s.flat for s in samples] == [True, True, False, False]
    assert metrics["adv_mean_benign"] == pytest.approx(0.0) and metrics["reward_mean_benign"] == 0.5
    # one group of both kinds (phases.blue.twin_groups): the lower-paid kind sits below
    for s, g in zip(samples, [0, 0, 0, 0]):
        s.group = g
    metrics = assign_advantages(samples, cfg)
    assert metrics["adv_mean_harmful"] > 0 > metrics["adv_mean_benign"] and metrics["reward_mean_harmful"] == 1.0


def _grads(model, tok, cfg, samples):
    params = activate(model, "blue")
    return GrpoLearner(model, params, cfg, lr=1e-3, pad_id=tok.pad_token_id).gradients(samples)


def _batch(tok):
    p = tok.encode("tell me a story")
    return [Sample(p, tok.encode("once upon a time"), 0, 1.0, advantage=1.0),
            Sample(p, tok.encode("no thanks"), 0, 0.0, advantage=-1.0),
            Sample(p, tok.encode("the end of it"), 1, 0.5, advantage=0.0, flat=True),
            Sample(p, tok.encode("again and again"), 1, 0.5, advantage=0.0, flat=True),
            Sample(p, tok.encode("cut off in the mid"), 2, 1.0, advantage=1.0, truncated=True),
            Sample(p, tok.encode("short"), 2, 0.0, advantage=-1.0)]


@pytest.mark.parametrize("option, leaves", [("drop_flat_groups", {2, 3}), ("mask_truncated", {4})])
def test_flat_groups_and_truncated_completions_can_leave_the_loss(role_model, option, leaves):
    """With the option on, the gradient is the one of the batch without those
    samples (not only a zero advantage: they leave the normaliser too, and
    their KL pull towards the base)."""
    model, tok = role_model
    batch = _batch(tok)
    cfg = GrpoConfig(beta=0.1, max_new_tokens=8, **{option: True})
    with_option = _grads(model, tok, cfg, batch)
    without = _grads(model, tok, GrpoConfig(beta=0.1, max_new_tokens=8), [s for i, s in enumerate(batch) if i not in leaves])
    plain = _grads(model, tok, GrpoConfig(beta=0.1, max_new_tokens=8), batch)
    for a, b in zip(with_option, without):
        assert torch.allclose(a, b, atol=1e-7)
    assert any(not torch.allclose(a, b, atol=1e-6) for a, b in zip(with_option, plain))  # it did change something


def test_the_kl_estimate_is_clamped(role_model):
    from lora_triplay.tiny import randomize_lora_b

    model, tok = role_model
    randomize_lora_b(model, seed=3, scale=20.0)  # blue far from the base: a clear per-token KL
    batch = [s for s in _batch(tok) if not s.flat]
    params = activate(model, "blue")
    free = GrpoLearner(model, params, GrpoConfig(beta=0.1, kl_clamp=None), lr=1e-9, pad_id=tok.pad_token_id).step(batch)
    cap = free.kl / 2  # below the mean: some tokens' estimate is above it
    clamped = GrpoLearner(model, params, GrpoConfig(beta=0.1, kl_clamp=cap), lr=1e-9, pad_id=tok.pad_token_id).step(batch)
    assert free.kl > 0.01 and 0 < clamped.kl <= cap + 1e-9


def test_warmup_ramps_the_rate_and_survives_a_resume(role_model, tmp_path):
    from lora_triplay.core.store import RunStore

    model, tok = role_model
    params = activate(model, "blue")
    learner = GrpoLearner(model, params, GrpoConfig(warmup_steps=4), lr=1e-2, pad_id=tok.pad_token_id)
    seen = []
    for _ in range(2):
        seen.append(learner.current_lr())
        learner.step([s for s in _batch(tok) if not s.flat])
    assert seen == pytest.approx([2.5e-3, 5e-3]) and learner.current_lr() == pytest.approx(7.5e-3)
    RunStore.save_optimizer(tmp_path, learner.optimizer)
    again = GrpoLearner(model, params, GrpoConfig(warmup_steps=4), lr=1e-2, pad_id=tok.pad_token_id)
    RunStore.load_optimizer(tmp_path, again.optimizer)
    assert again.updates_done() == 2 and again.current_lr() == pytest.approx(7.5e-3)
    assert GrpoLearner(model, params, GrpoConfig(), lr=1e-2, pad_id=tok.pad_token_id).current_lr() == 1e-2


# ------------------------------------------------- blue's reward, end to end

def _first_char_refuses(text: str) -> bool | None:
    """The scripted judge's notion of a refusal: the answer's first visible
    character is a letter a-m. None: no visible character."""
    text = text.lstrip()
    return None if not text else text[0].lower() in "abcdefghijklm"


def _refusal_mass(session, prompts: list[str]) -> float:
    """Mean probability, under blue, that the first answer token is a
    refusal (by the scripted judge's rule)."""
    from lora_triplay.triplay.roles import blue_messages

    engine, model = session.engine, session.model
    tok = session.tokenizer
    marks = torch.tensor([_first_char_refuses(tok.decode([i])) is True for i in range(len(tok))])
    activate(model, "blue")
    total = 0.0
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([engine.encode(blue_messages(p))])
            probs = torch.softmax(model(input_ids=ids).logits[0, -1].double(), -1)
            total += probs[: len(marks)][marks].sum().item()
    return total / len(prompts)


@pytest.fixture(scope="module")
def roomy_tiny_model(tmp_path_factory):
    """The tiny Qwen3 with weights of std 0.2: transformers' 0.02 leaves the
    next-token distribution nearly uniform whatever the adapter does."""
    from lora_triplay.tiny import build_tiny_qwen3

    return str(build_tiny_qwen3(tmp_path_factory.mktemp("roomy-tiny"), init_std=0.2))


@pytest.mark.parametrize("kind", ["harmful", "benign"])
def test_blue_learns_the_sign_of_its_judge(roomy_tiny_model, tmp_path, kind):
    """Blue alone on the seed requests, its reward from a scripted judge
    (`rewards.blue_judge` swapped for a function): on harmful requests a
    refusal is rejective (0) and anything else negative (-1), so refusals
    must become more likely; on benign ones anything else is positive (+1),
    so refusals must become less likely (the harmful ones of that run are
    left unjudged, so only the benign sign trains). A judge with random
    labels moved the same measure by at most 0.08 (seeds 0-2, measured)."""
    from lora_triplay.core.session import Session
    from lora_triplay.recipe import build_recipe

    recipe = build_recipe({
        "model": {"base": roomy_tiny_model, "device": "cpu", "dtype": "float32"},
        "lora": {"rank": 4, "alpha": 8},
        "phases": {"red": {"steps": 0}, "blue": {"steps": 10}, "eval": {"steps": 0}},
        "grpo": {"group_size": 16, "prompts_per_step": 2 if kind == "harmful" else 4, "lr": 3e-2, "beta": 0.0, "max_new_tokens": 1},
        "rewards": {"judge_mode": "choice", "embedding_model": "hashing", "blue_judge": "rules"},
        "experts": {"safety_experts": 1, "utility_experts": 1},
        "data": {"blue_attacks": "seeds", "benign_share": 0.5 if kind == "benign" else 0.0},
    })
    session = Session.open(recipe, tmp_path / "run")
    seen = []

    def scripted(cases):
        seen.extend(c.expected for c in cases)
        out = []
        for c in cases:
            refuses = _first_char_refuses(c.response)
            if refuses is None or c.expected != kind:
                out.append(None)
            else:
                out.append("rejective" if refuses else "negative" if kind == "harmful" else "positive")
        return out

    session.game.blue_judge = scripted
    prompts = [b.prompt for b in (session.game.data.benign if kind == "benign" else session.game.data.basic)][:8]
    before = _refusal_mass(session, prompts)
    session.run()
    after = _refusal_mass(session, prompts)
    assert kind in seen
    if kind == "harmful":
        assert after > before + 0.25, (before, after)
    else:
        assert after < before - 0.2, (before, after)
