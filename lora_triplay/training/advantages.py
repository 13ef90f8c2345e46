"""What GRPO learns from, without torch: a sample (one completion and its
reward), and the group-relative advantages the rewards become.

Kept apart from grpo.py (the learner, which needs torch) because games
build samples and advantages in modules that `lora-triplay validate`
imports to read a recipe (core/snapshots.py asks every game for its
roles): checking a recipe should not cost torch's 1-2 s import.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..recipe import GrpoConfig


@dataclass
class Sample:
    """One completion to learn from."""

    prompt_ids: list[int]
    completion_ids: list[int]
    group: int
    reward: float | None  # None: dropped (malformed judge output)
    advantage: float = 0.0
    truncated: bool = False  # cut at max_new_tokens (grpo.mask_truncated)
    kind: str | None = None  # what its prompt was (harmful / benign ...), for per-kind diagnostics
    flat: bool = False  # its group's rewards do not spread (grpo.drop_flat_groups)


SCALES = {True: "group", False: "none"}  # the old boolean spelling of `scale`


def _std(values: list[float]) -> float:
    """Unbiased, as TRL's."""
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def group_advantages(rewards: list[float | None], groups: list[int], scale: str | bool = "group", eps: float = 1e-4,
                     min_std: float = 0.0) -> list[float]:
    """A_i = (r_i - mean_g) / (std + eps): std of the group (`group`), of the
    whole batch (`batch`, PPO-Lite), or no division (`none`, Dr. GRPO).
    Dropped samples (None) get 0 and stay out of every statistic; a group
    whose std is at most `min_std` (or has one sample) counts as all-equal
    and gets 0 throughout."""
    return _advantages(rewards, groups, SCALES.get(scale, scale), eps, min_std)[0]


def _advantages(rewards, groups, scale: str, eps: float, min_std: float) -> tuple[list[float], set[int]]:
    out = [0.0] * len(rewards)
    by_group: dict[int, list[int]] = {}
    for i, (r, g) in enumerate(zip(rewards, groups)):
        if r is not None:
            by_group.setdefault(g, []).append(i)
    batch_std = _std([r for r in rewards if r is not None])
    flat = set()
    for g, idx in by_group.items():
        values = [rewards[i] for i in idx]
        std = _std(values)
        if len(values) < 2 or std <= min_std:
            flat.add(g)
            continue
        mean = sum(values) / len(values)
        divisor = {"group": std + eps, "batch": batch_std + eps, "none": 1.0}[scale]
        for i in idx:
            out[i] = (rewards[i] - mean) / divisor
    return out, flat


def assign_advantages(samples: list[Sample], cfg: GrpoConfig) -> dict[str, float]:
    """Set every sample's advantage (and `flat`) from its reward and group,
    with the recipe's scaling and minimum spread; returns the step's GRPO
    diagnostics: `frac_zero_std` (share of groups with no signal),
    `clipped_ratio` (share of completions cut at the token budget),
    `adv_abs_<kind>` (mean |advantage| per prompt kind) and `adv_mean_<kind>`
    (signed: ~0 where a group holds one kind; where groups mix kinds, how
    far one kind sits below the other) with `reward_mean_<kind>`."""
    values, flat = _advantages([s.reward for s in samples], [s.group for s in samples], cfg.scale_rewards, 1e-4, cfg.min_reward_std)
    for s, a in zip(samples, values):
        s.advantage, s.flat = a, s.group in flat
    groups = {s.group for s in samples}
    out = {"frac_zero_std": len(flat & groups) / max(len(groups), 1),
           "clipped_ratio": sum(s.truncated for s in samples) / max(len(samples), 1)}
    for kind in sorted({s.kind for s in samples if s.kind}):
        mine = [s for s in samples if s.kind == kind]
        out[f"adv_abs_{kind}"] = sum(abs(s.advantage) for s in mine) / len(mine)
        out[f"adv_mean_{kind}"] = sum(s.advantage for s in mine) / len(mine)
        rewarded = [s.reward for s in mine if s.reward is not None]
        if rewarded:
            out[f"reward_mean_{kind}"] = sum(rewarded) / len(rewarded)
    return out
