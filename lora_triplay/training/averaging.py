"""Tail averaging (Polyak-Ruppert) of a role's weights over a phase's last steps.

Why: eval's warm start (supervised, batches of 8 at a rate of 1e-3) ends
wherever its last few batches push it; one seed's warm start gave 0.54 on the
labelled answer set with its last weights and 0.68 with the mean of its last
15 (bench/eval_warm_orders.py). The mean of the iterates along the path is
the classic cure for that noise.

The running mean lives in the optimizer's per-parameter state (keys below),
so a checkpoint saves it with the AdamW moments (store.save_optimizer) and a
resume in the middle of the tail goes on exactly. A running mean rather than
a sum keeps it in the weights' own dtype and range, which the optimizer's
state loading casts to.
"""
from __future__ import annotations

import torch

MEAN, COUNT = "tail_mean", "tail_count"


def add_to_tail(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter]) -> None:
    """Fold the weights as they are now into the running mean."""
    with torch.no_grad():
        for p in params:
            state = optimizer.state[p]
            if "step" not in state:  # never updated: AdamW builds its state on an empty entry; keep it empty
                continue
            n = state.get(COUNT, 0) + 1
            state[MEAN] = p.detach().clone() if n == 1 else state[MEAN] + (p.detach() - state[MEAN]) / n
            state[COUNT] = n


def take_tail_average(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter]) -> int:
    """Put the running mean into the weights and forget it; returns how many
    steps the mean covered (0: nothing was averaged)."""
    covered = 0
    with torch.no_grad():
        for p in params:
            state = optimizer.state.get(p, {})
            if MEAN in state:
                p.copy_(state.pop(MEAN))
                covered = max(covered, state.pop(COUNT))
    return covered
