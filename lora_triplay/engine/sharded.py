"""One engine call split across the ranks of a multi-process run.

Every rank runs the same loop on the same data, so every rank makes the
same engine calls with the same requests. Each rank serves its contiguous
block of the requests (a request is a GRPO group: its `n` samples stay on
one rank) and the completions are gathered back in order, so rewards,
metrics and pools come out identical on every rank without a second code
path. Sampling is seeded per request (`base.row_seed`) from one draw of the
global RNG that every rank makes alike: a request samples the same tokens
on whichever rank serves it, and the run resumes exactly.

With vLLM tensor parallel (`engine.tensor_parallel_size` = t > 1) every t
consecutive ranks form one engine: they serve the same block, and one
rank per group contributes to the gather.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import torch

from ..core.distributed import Collective
from ..errors import UserError
from .base import Completion, Request, Sampling


class ShardedEngine:
    def __init__(self, inner, collective: Collective, group: int = 1):
        if collective.world % group:
            raise UserError(f"engine.tensor_parallel_size {group} must divide the number of processes ({collective.world})")
        self.inner, self.collective, self.group = inner, collective, group
        self.local_requests = 0  # what this rank served (generate + scoring), for reports

    def __getattr__(self, name):  # adapters, encode, sync, sleep ...: the rank's own engine
        return getattr(self.inner, name)

    def _check_adapters(self, requests: Sequence[Request]) -> None:
        """An adapter the engine does not serve fails on every rank alike,
        before any rank starts: failing only on the rank whose block holds
        the request would leave the others waiting in the gather."""
        known = set(self.inner.adapters())
        for r in requests:
            if r.adapter not in known:
                raise KeyError(f"adapter {r.adapter!r} is not loaded; known: {', '.join(sorted(known))}")

    def generate(self, requests: Sequence[Request], sampling: Sampling) -> list[list[Completion]]:
        self._check_adapters(requests)
        if sampling.seed is None and not sampling.greedy:
            sampling = replace(sampling, seed=int(torch.randint(0, 2**31 - 1, (1,))))
        start, mine = self.collective.block(list(requests), self.group)
        self.local_requests += len(mine)
        local = self.inner.generate(mine, sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + start))
        out = [comps for part in self._gather(local) for comps in part]
        for r_i, comps in enumerate(out):
            for comp in comps:
                comp.request_index = r_i
        return out

    def score_choices(self, requests: Sequence[Request]) -> list[list[list[float]]]:
        self._check_adapters(requests)
        _, mine = self.collective.block(list(requests), self.group)
        self.local_requests += len(mine)
        return [scores for part in self._gather(self.inner.score_choices(mine)) for scores in part]

    def _gather(self, local):
        """Every engine group's part, in order (one rank's copy per group)."""
        return self.collective.gather(local)[:: self.group]
