"""Blue's reward (method.md, "P_blue"): eval's class of blue's answer to the
latest red prompts, negative -> -1, rejective -> 0, positive -> +1."""
from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

BLUE_VALUES: Mapping[str, float] = MappingProxyType({"negative": -1.0, "rejective": 0.0, "positive": 1.0})


def blue_reward(label: str | None, values: Mapping[str, float] = BLUE_VALUES) -> float | None:
    """Reward for one answer; None (malformed eval output) drops the sample."""
    if label is None:
        return None
    if label not in values:
        raise ValueError(f"no blue reward for class {label!r}; values given for {sorted(values)}")
    return float(values[label])
