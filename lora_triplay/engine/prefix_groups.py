"""Which prompts of a batch share a prefix computed once: the prefill's plan.

The HF engine lays a batch out as [shared prefix | left-padded suffix]
(hf.py `_prefill`): each group's prefix runs once per adapter in the group,
then every row's suffix runs in one padded forward, as wide as the longest
suffix. Where groups are cut decides what that costs. Eval judging a blue
step is the case that matters: 64 answers to 8 requests, every prompt
starting with eval's ~320-token template, each request's 8 answers also
sharing the request (~100 more tokens). One group over the whole batch
shares the template only, and all 64 rows then carry their request in the
padded suffix; one group per request computes each request once and leaves
only the answers in the suffix (bench/bench_judge_groups.py).

Prompts come sorted (hf.py `_batches`), so prompts sharing a long prefix are
neighbours and a group is a run of them. Each cut of the batch at a
threshold of neighbours' common prefix is a candidate plan: a run continues
while the next prompt shares at least that many tokens with the previous
one. The plan chosen is the one with the fewest tokens run (every group's
prefix once per adapter, plus rows x the widest suffix, plus a forward's
fixed cost per group); the lowest threshold (the plan of one group per
system prompt, what the engine did before) is always among the candidates.
"""
from __future__ import annotations

from typing import Sequence

from ..training.forward import common_prefix


def _runs(neighbours: list[int], threshold: int) -> list[list[int]]:
    """Row indices cut where a row shares fewer than `threshold` tokens with the row before."""
    runs: list[list[int]] = [[0]]
    for i in range(1, len(neighbours)):
        if neighbours[i] >= threshold:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def _shares(runs: list[list[int]], neighbours: list[int], names: Sequence[str], minimum: int, n_rows: int) -> list[int]:
    """Per row, the prefix its run shares (0: none). A run's prefix is the
    least of its neighbours' common prefixes (common to every row of it); it
    is computed once per adapter in the run (LoRA changes keys and values),
    so it pays only when the run's rows outnumber its adapters."""
    shared = [0] * n_rows
    for run in runs:
        if len({names[i] for i in run}) < len(run):
            n = min(neighbours[i] for i in run[1:])
            if n >= minimum:
                for i in run:
                    shared[i] = n
    return shared


def tokens_run(prompts: Sequence[Sequence[int]], names: Sequence[str], shared: list[int]) -> tuple[int, int]:
    """(tokens, prefix forwards) of a prefill of `prompts` with these
    shares: every group's prefix once per adapter, then rows x the widest
    suffix (padding included)."""
    groups: dict[tuple, set] = {}
    for p, a, n in zip(prompts, names, shared):
        if n:
            groups.setdefault(tuple(p[:n]), set()).add(a)
    widest = max(len(p) - n for p, n in zip(prompts, shared))
    return sum(len(k) * len(a) for k, a in groups.items()) + len(prompts) * widest, len(groups)


def _cost(runs: list[list[int]], shared: list[int], names: Sequence[str], lengths: list[int], forward_cost: int) -> int:
    """tokens_run's count from the runs (no prefix compared again: sorted
    prompts sharing a prefix are one run), plus `forward_cost` tokens' worth
    per prefix forward."""
    grouped = [run for run in runs if shared[run[0]]]
    prefixes = sum(shared[run[0]] * len({names[i] for i in run}) + forward_cost for run in grouped)
    return prefixes + len(lengths) * max(n - s for n, s in zip(lengths, shared))


def plan(prompts: Sequence[Sequence[int]], names: Sequence[str], minimum: int, several: bool = True,
         cheapest: bool = True) -> list[int]:
    """Per row, the length of the prefix it shares with its group (0: none),
    for the cheapest plan (module docstring). With `several` False (no cache
    to assemble groups into) the whole batch is one group; with `cheapest`
    False, the lowest threshold's plan (the engine's before 2026-12-06,
    for bench/bench_judge_groups.py's comparison)."""
    if not prompts:
        return []
    # what each prompt shares with the one before (keeping a token of each for its own pass)
    neighbours = [0] + [common_prefix(prompts[i - 1 : i + 1], minimum=0) for i in range(1, len(prompts))]
    lengths = [len(p) for p in prompts]
    if not several:
        return _shares([list(range(len(prompts)))], neighbours, names, minimum, len(prompts))
    best, best_cost = None, None
    for threshold in sorted({minimum} | ({n for n in neighbours if n > minimum} if cheapest else set())):
        runs = _runs(neighbours, threshold)
        shared = _shares(runs, neighbours, names, minimum, len(prompts))
        cost = _cost(runs, shared, names, lengths, forward_cost=minimum)
        if best_cost is None or cost < best_cost:  # ties: the lower threshold, fewer forwards
            best, best_cost = shared, cost
    return best
