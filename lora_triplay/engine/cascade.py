"""Cascade attention for sampled rollouts: a prompt's keys and values read
once per decode step for all of its samples, not once per sample.

A blue step samples 8 answers to each of 8 prompts (~190 prompt tokens,
40 new). With the prompt's cache copied into every sample's row, a decode
step of SmolLM2-135M reads 64 copies of the prompts' keys and values,
~560 MB over its 30 layers, about as much as its weights (~540 MB); the
batched per-row matmuls that read them took 2.2 s of a 14.8 s rollout
(torch.profiler, 2 threads). Here the prompts' cache stays one row per
distinct prompt (the prefix) and the samples' own tokens go to a small
cache of their own (the suffix). A decode step scores the queries of one
prompt's rows against its keys as one matmul, each row against its own
tokens, and takes one softmax over both: exactly attention over the
concatenation, summed in another order.

`Cascade.over(...)` makes it the one the decode attention reads
(`fastpath.decode_attention`), for the duration of one rollout.
"""
from __future__ import annotations

import contextlib
import contextvars

import torch

from ..training.precision import widened

_ACTIVE: contextvars.ContextVar[Cascade | None] = contextvars.ContextVar("lora_triplay_cascade", default=None)


def active() -> Cascade | None:
    """The cascade of the rollout running now, if any."""
    return _ACTIVE.get()


class Cascade:
    """The prompts' cache (U rows) and which prompt each of the batch's B
    rows samples from. Rows are laid out in slots, W per prompt (W: the
    most rows any prompt has), so that one batched matmul serves every
    prompt's rows; empty slots hold a zero query and are never read back."""

    def __init__(self, prefix_cache, prefix_mask: torch.Tensor, owner: torch.Tensor):
        self.keys = [layer.keys for layer in prefix_cache.layers]
        self.values = [layer.values for layer in prefix_cache.layers]
        U, L = prefix_mask.shape
        if self.keys[0].shape[0] != U or self.keys[0].shape[2] != L:
            raise ValueError(f"prefix cache {tuple(self.keys[0].shape)} does not match its mask {tuple(prefix_mask.shape)}")
        # additive: 0 where a prompt has a token, -inf on its padding
        self.bias = torch.zeros((U, 1, 1, L), dtype=torch.float32, device=prefix_mask.device)
        self.bias.masked_fill_(prefix_mask.view(U, 1, 1, L) == 0, float("-inf"))
        self.select(owner)

    @classmethod
    @contextlib.contextmanager
    def over(cls, prefix_cache, prefix_mask: torch.Tensor, owner: torch.Tensor):
        cascade = cls(prefix_cache, prefix_mask, owner)
        token = _ACTIVE.set(cascade)
        try:
            yield cascade
        finally:
            _ACTIVE.reset(token)

    def select(self, owner: torch.Tensor) -> None:
        """Row i of the batch samples from prompt owner[i]."""
        self.owner = owner
        U, B = self.bias.shape[0], len(owner)
        counts = torch.bincount(owner, minlength=U)
        self.width = max(1, int(counts.max()))
        order = torch.argsort(owner, stable=True)
        rank = torch.empty_like(owner)
        rank[order] = torch.arange(B, device=owner.device) - (counts.cumsum(0) - counts)[owner[order]]
        self.slot = owner * self.width + rank  # row -> its slot
        self.row_of_slot = torch.full((U * self.width,), B, dtype=torch.long, device=owner.device)  # B: the zero row
        self.row_of_slot[self.slot] = torch.arange(B, device=owner.device)

    def keep(self, kept: torch.Tensor) -> None:
        """The batch kept only rows `kept` (finished rows left it)."""
        self.select(self.owner[kept])

    def _to_slots(self, rows: torch.Tensor) -> torch.Tensor:
        """(B, KVH, G, X) by row -> (U, KVH, W*G, X) by prompt, empty slots zero."""
        B, KVH, G, X = rows.shape
        padded = torch.cat([rows, rows.new_zeros((1, KVH, G, X))])[self.row_of_slot]
        U = self.bias.shape[0]
        return padded.view(U, self.width, KVH, G, X).transpose(1, 2).reshape(U, KVH, self.width * G, X)

    def _to_rows(self, slots: torch.Tensor, G: int) -> torch.Tensor:
        """(U, KVH, W*G, X) by prompt -> (B, KVH, G, X) by row."""
        U, KVH, _, X = slots.shape
        return slots.view(U, KVH, self.width, G, X).transpose(1, 2).reshape(U * self.width, KVH, G, X)[self.slot]

    def attend(self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask, scale: float):
        """query (B, KVH, G, D): one token per row, its G query heads grouped
        on their key/value head; key/value (B, KVH, T, D): the rows' own
        tokens so far; mask: transformers' mask over those (B, 1, 1, T) or
        None. Returns (B, KVH, G, D).

        Each part is attended on its own, in its own layout, and the two
        merged by their log-sum-exps, so only outputs (D wide) move between
        the prompts' layout and the rows', never scores (L wide): moving
        scores and probabilities cost more copying (1.6 s a blue rollout)
        than the shared reads saved."""
        G = query.shape[2]
        prefix_k, prefix_v = self.keys[layer], self.values[layer]
        scores = widened(torch.matmul(self._to_slots(query), prefix_k.transpose(-1, -2))).mul_(scale).add_(self.bias)
        from_prefix, lse_prefix = _attend(scores, prefix_v)  # (U, KVH, W*G, D), (U, KVH, W*G, 1)
        from_prefix, lse_prefix = self._to_rows(from_prefix, G), self._to_rows(lse_prefix, G)
        own = widened(torch.matmul(query, key.transpose(-1, -2))).mul_(scale)  # (B, KVH, G, T)
        if mask is not None:
            own = own.masked_fill_(~mask, float("-inf")) if mask.dtype == torch.bool else own.add_(mask.to(own.dtype))
        from_own, lse_own = _attend(own, value)
        lse = torch.logaddexp(lse_prefix, lse_own)
        return (from_prefix * torch.exp(lse_prefix - lse) + from_own * torch.exp(lse_own - lse)).to(value.dtype)


def _attend(scores: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scores) @ values and the scores' log-sum-exp. A row with every
    score -inf (a finished row's own tokens, all masked) gives zeros and
    -inf, which the merge weighs 0, not NaN."""
    lse = torch.logsumexp(scores, -1, keepdim=True)
    probs = torch.exp(scores - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse)))
    return torch.matmul(probs.to(values.dtype), values), lse
