"""Rewards for the three roles and the diversity machinery red's reward uses.

Contract: one float per sample, or None to drop it (malformed judge output),
plus named sub-scores for logging where a reward has parts.
"""
from .blue import BLUE_VALUES, blue_reward
from .diversity import (
    AttackSuccessPool,
    EmbeddingPool,
    Encoder,
    HashingEncoder,
    SelfBleuIndex,
    SentenceEncoder,
    diversity_penalty,
    load_sentence_encoder,
    output_diversity,
    shaped,
    tokenize,
)
from .eval import eval_reward
from .red import attack_succeeded, red_reward
from .values import Judgement, class_value

__all__ = [
    "Judgement",
    "class_value",
    "AttackSuccessPool",
    "BLUE_VALUES",
    "EmbeddingPool",
    "Encoder",
    "HashingEncoder",
    "SelfBleuIndex",
    "SentenceEncoder",
    "attack_succeeded",
    "blue_reward",
    "diversity_penalty",
    "eval_reward",
    "load_sentence_encoder",
    "output_diversity",
    "red_reward",
    "shaped",
    "tokenize",
]
