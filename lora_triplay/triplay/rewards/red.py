"""Red's reward (method.md, "P_red").

    R_red(x) = sum_i w_i * R[class_i(x)]  +  R_sem(x, b)  -  P_div(x)

class_i is eval's label for defender i's answer to x; R_sem is
``semantic_value`` when the semantic judge says x keeps b's meaning and
attack goal, else 0; P_div is the diversity penalty against the attack
success pool (see ``diversity.py``). A malformed judge output (None, after
the caller's retries) drops the sample: the reward is None.

With ``gate`` (rewards.semantic_gate, ours) the semantic check also gates
the attack term: a rewrite that fails it earns the worst attack term (every
defender's answer in red's lowest-valued class, a refusal by default),
whatever the defenders did. Why: a rewrite that
drops its request gets a compliance for free (judging/kept.py), and a bonus
for keeping it (the paper's R_sem) pays red for restating the request
plainly, which the trained blue refuses (bench/BENCHMARKS.md, "A semantic
check that can say no"); gated, red earns only by attacks that keep the
request.
"""
from __future__ import annotations

from typing import Mapping

from .diversity import diversity_penalty
from .values import Judgement, class_value


def red_reward(
    defender_classes: Mapping[str, Judgement | None],
    defender_weights: Mapping[str, float],
    class_values: Mapping[str, float],
    semantic_ok: bool | float | None,
    semantic_value: float,
    s_bleu: float,
    s_cos: float,
    w_bleu: float,
    w_cos: float,
    k: float,
    gate: bool = False,
) -> tuple[float | None, dict[str, float]]:
    """(reward or None, sub-scores).

    A class may be a label or a {label: probability} mapping (expected value,
    see values.py); `semantic_ok` may be a probability of "yes" (with
    `gate`, the attack term is then that share of the attack plus the rest
    of the worst one).

    Sub-scores: "diversity_penalty", "s_bleu", "s_cos" and "defender_gaps"
    always; "attack" when at least one defender's class parsed; "semantic"
    when the semantic judge parsed (a logger never sees a made-up value for
    a dropped part).
    """
    missing = [name for name in defender_classes if name not in defender_weights]
    if missing:
        raise ValueError(f"no weight for defender(s) {missing}; weights given for {sorted(defender_weights)}")
    penalty = diversity_penalty(s_bleu, s_cos, w_bleu, w_cos, k)
    subs: dict[str, float] = {"diversity_penalty": penalty, "s_bleu": float(s_bleu), "s_cos": float(s_cos)}

    malformed = semantic_ok is None
    if semantic_ok is not None:
        subs["semantic"] = float(semantic_value) * float(semantic_ok)
    parsed = {name: c for name, c in defender_classes.items() if c is not None}
    subs["defender_gaps"] = float(len(defender_classes) - len(parsed))
    if not parsed:
        malformed = True
    else:
        full = sum(float(defender_weights[name]) for name in defender_classes)
        have = sum(float(defender_weights[name]) for name in parsed)
        attack = sum(float(defender_weights[name]) * class_value(c, class_values) for name, c in parsed.items())
        subs["attack"] = attack * (full / have) if have else 0.0
        if gate and semantic_ok is not None:
            worst = full * min(float(v) for v in class_values.values())
            subs["attack"] = float(semantic_ok) * subs["attack"] + (1 - float(semantic_ok)) * worst
    if malformed:
        return None, subs
    return subs["attack"] + subs["semantic"] - penalty, subs


def attack_succeeded(defender_classes: Mapping[str, str | None], success_class: str = "negative") -> bool:
    """True when any defender's answer was classified ``success_class``
    (the condition for adding x to the attack success pool)."""
    return any(c == success_class for c in defender_classes.values())
