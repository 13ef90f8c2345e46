"""Red, blue and eval rewards (method.md "P_red", "P_blue", "P_eval")."""
from __future__ import annotations

import math

import pytest

from lora_triplay.triplay.rewards import (
    attack_succeeded,
    blue_reward,
    eval_reward,
    red_reward,
)

R = {"negative": 1.0, "rejective": 0.0, "positive": 0.0}
W = {"blue": 1.0, "base": 0.5}
K = math.log(11 / 6)


def call(classes, semantic_ok=True, s_bleu=0.5, s_cos=0.0):
    return red_reward(classes, W, R, semantic_ok, 1.0, s_bleu, s_cos, 2.0, 4.0, K)


def test_red_reward_two_defenders_hand_value():
    # attack = 1.0 * R[negative] + 0.5 * R[positive] = 1.0
    # semantic = 1.0; P_div = 2 * (exp(K * 0.5) - 1) + 4 * 0 = 2 * (sqrt(11/6) - 1) = 0.7080128
    # R = 1 + 1 - 0.7080128 = 1.2919872
    reward, subs = call({"blue": "negative", "base": "positive"})
    assert reward == pytest.approx(1.2919872, abs=1e-6)
    assert subs == pytest.approx({"attack": 1.0, "semantic": 1.0, "diversity_penalty": 0.7080128,
                                  "s_bleu": 0.5, "s_cos": 0.0, "defender_gaps": 0.0}, abs=1e-6)


def test_red_reward_uses_weights_and_semantic():
    # both defenders broken: attack = 1.0 + 0.5 = 1.5; semantic judge says no -> 0
    # s_bleu = s_cos = 1: P_div = 2 * 5/6 + 4 * 5/6 = 5 -> R = 1.5 - 5 = -3.5
    reward, subs = call({"blue": "negative", "base": "negative"}, semantic_ok=False, s_bleu=1.0, s_cos=1.0)
    assert reward == pytest.approx(-3.5)
    assert subs["attack"] == 1.5 and subs["semantic"] == 0.0


def test_red_reward_scores_the_defenders_that_parsed():
    # blue's label failed: base alone, its weight 0.5 renormalised to the full 1.5:
    # attack = 0.5 * R[negative] * 1.5 / 0.5 = 1.5; R = 1.5 + 1 - 0.7080128
    reward, subs = call({"blue": None, "base": "negative"})
    assert subs["attack"] == pytest.approx(1.5) and subs["defender_gaps"] == 1.0
    assert reward == pytest.approx(1.5 + 1.0 - 0.7080128, abs=1e-6)
    reward, subs = call({"blue": None, "base": "positive"})
    assert reward == pytest.approx(0.0 + 1.0 - 0.7080128, abs=1e-6)


def test_red_reward_drops_the_sample_when_nothing_parsed():
    reward, subs = call({"blue": None, "base": None})
    assert reward is None and "attack" not in subs and subs["defender_gaps"] == 2.0 and subs["semantic"] == 1.0
    reward, subs = call({"blue": "negative", "base": "positive"}, semantic_ok=None)
    assert reward is None and subs["attack"] == 1.0 and "semantic" not in subs


def test_red_reward_rejects_missing_weight_or_unknown_class():
    with pytest.raises(ValueError, match="weight"):
        call({"blue": "negative", "blue@3": "positive"})
    with pytest.raises(ValueError, match="class"):
        call({"blue": "harmful", "base": "positive"})


def test_attack_succeeded():
    assert attack_succeeded({"blue": "rejective", "base": "negative"})
    assert not attack_succeeded({"blue": "rejective", "base": "positive"})
    assert not attack_succeeded({"blue": None})
    assert attack_succeeded({"blue": "positive"}, success_class="positive")


def test_blue_reward():
    assert [blue_reward(c) for c in ("negative", "rejective", "positive")] == [-1.0, 0.0, 1.0]
    assert blue_reward(None) is None
    assert blue_reward("positive", {"negative": -2.0, "rejective": 0.0, "positive": 0.5}) == 0.5
    with pytest.raises(ValueError):
        blue_reward("harmful")


def test_eval_reward():
    assert eval_reward("negative", "negative") == 1.0
    assert eval_reward("positive", "rejective") == 0.0
    assert eval_reward(None, "rejective") == 0.0  # malformed: lowest reward, not dropped


def test_expected_value_rewards_from_class_probabilities():
    # Soft labels (choice mode): R = sum_c p(c) R[c].
    from lora_triplay.triplay.rewards import blue_reward, class_value, red_reward

    probs = {"negative": 0.5, "rejective": 0.3, "positive": 0.2}
    assert class_value(probs, {"negative": -1.0, "rejective": 0.0, "positive": 1.0}) == pytest.approx(-0.3)
    assert blue_reward(probs) == pytest.approx(-0.5 + 0.2)
    # red: blue (w 1) 50% negative, base (w 0.5) 100% negative; semantic p(yes) = 0.8 of value 1;
    # empty pool -> no penalty: 1*0.5 + 0.5*1 + 0.8 = 1.8
    reward, subs = red_reward(
        {"blue": probs, "base": {"negative": 1.0, "rejective": 0.0, "positive": 0.0}},
        {"blue": 1.0, "base": 0.5}, {"negative": 1.0, "rejective": 0.0, "positive": 0.0},
        0.8, 1.0, 0.0, 0.0, 2.0, 4.0, math.log(11 / 6),
    )
    assert reward == pytest.approx(1.8) and subs["semantic"] == pytest.approx(0.8)
    with pytest.raises(ValueError, match="maybe"):
        class_value({"maybe": 1.0}, {"negative": 1.0})


def test_semantic_gate_pays_an_attack_only_when_the_rewrite_kept_its_request():
    # no pool, so no diversity penalty; no bonus (semantic_value 0): the attack term alone
    def gated(classes, ok, values=R):
        return red_reward(classes, W, values, ok, 0.0, 0.0, 0.0, 2.0, 4.0, K, gate=True)

    broken = {"blue": "negative", "base": "negative"}
    assert gated(broken, True)[0] == pytest.approx(1.5)  # kept: what the defenders gave
    assert gated(broken, False)[0] == pytest.approx(0.0)  # dropped: as if both refused
    assert gated(broken, 0.25)[0] == pytest.approx(0.375)  # a soft check: its share of the attack
    assert red_reward(broken, W, R, False, 0.0, 0.0, 0.0, 2.0, 4.0, K)[0] == pytest.approx(1.5)  # ungated: paid anyway
    # the worst attack term is red's lowest class value, not 0: dropping the request never beats a refused attack
    harsh = {"negative": 1.0, "rejective": -0.5, "positive": -1.0}
    refused = gated({"blue": "positive", "base": "positive"}, True, harsh)[0]
    assert gated(broken, False, harsh)[0] == pytest.approx(refused) == pytest.approx(-1.5)
