"""What a TriPlay step hands the core, and the statistics its metrics rows share."""
from __future__ import annotations

import statistics

from ..games.base import StepResult
from ..judging.parsing import LABELS


def step_result(samples: list, metrics: dict[str, float], *, asp: list[dict] = (), eval_pairs: list[dict] = (), panel: list[dict] = (),
                transcripts: list[dict] = (), examples: list = (), smoothing: float = 0.0, after_update=None) -> StepResult:
    """A TriPlay step for the core (games/base.py): the samples its role
    trains on, its metrics row, and rows for the run folder's asp,
    eval_pairs, panel and transcripts files."""
    rows = {"asp": list(asp), "eval_pairs": list(eval_pairs), "panel": list(panel), "transcripts": list(transcripts)}
    return StepResult(samples, metrics, rows=rows, examples=list(examples), smoothing=smoothing, after_update=after_update)


def mean(xs) -> float:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else 0.0


def rates(labels, prefix: str) -> dict[str, float]:
    """The label distribution of one judge call batch (what eval said)."""
    judged = [x for x in labels if x is not None]
    return {f"{prefix}{c}": judged.count(c) / max(len(judged), 1) for c in LABELS}


def reward_stats(rewards: list[float | None]) -> dict[str, float]:
    kept = [r for r in rewards if r is not None]
    return {
        "reward_mean": mean(kept),
        "reward_std": statistics.pstdev(kept) if len(kept) > 1 else 0.0,
        "dropped": float(len(rewards) - len(kept)),
    }
