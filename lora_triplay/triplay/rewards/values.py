"""A judge's verdict as a reward value: hard label or expected value.

In forced-choice judging (`rewards.judge_mode: choice`) the judge gives a
probability for each class; rewards may use the expected value
sum_c p(c) * R[c] (`rewards.soft_labels`), a lower-variance signal that also
keeps the judge's confidence. A hard label is the special case p = one-hot.
"""
from __future__ import annotations

from typing import Mapping, Union

Judgement = Union[str, Mapping[str, float]]


def class_value(judgement: Judgement, values: Mapping[str, float]) -> float:
    if isinstance(judgement, str):
        if judgement not in values:
            raise ValueError(f"no reward value for class {judgement!r}; values given for {sorted(values)}")
        return float(values[judgement])
    unknown = sorted(set(judgement) - set(values))
    if unknown:
        raise ValueError(f"no reward value for class(es) {unknown}; values given for {sorted(values)}")
    return float(sum(p * values[c] for c, p in judgement.items()))
