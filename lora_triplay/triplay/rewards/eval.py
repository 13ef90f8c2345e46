"""Eval's reward (method.md, "P_eval"): verifiable, 1 if eval's class matches
the expert panel's majority label, else 0. A malformed answer (None) earns
0.0, the lowest reward, rather than being dropped: dropping would let eval
dodge hard pairs by answering off-format."""
from __future__ import annotations


def eval_reward(predicted: str | None, reference: str) -> float:
    """1.0 if ``predicted == reference`` else 0.0 (None -> 0.0)."""
    return 1.0 if predicted is not None and predicted == reference else 0.0
