"""Per-token log-probs of completions under the policy, for GRPO.

Two layouts give the same numbers and the same gradient (tests/test_forward.py):

- **shared prompt** (`SHARED`): the prefix all prompts share goes through
  the model once, each distinct prompt's remainder once, then every
  completion runs on top of its prompt's KV cache. A GRPO group's G samples
  share one prompt, so the prompt costs 1/G of a naive batch, and a system
  prompt or judge template once per micro-batch, forward and backward. It needs a KV cache that survives the
  forward, which transformers drops under gradient checkpointing in
  training mode.
- **full sequence** (`FULL`): every row is its prompt followed by its
  completion, right-padded; no cache. Valid under every memory setting
  (gradient checkpointing, any attention kernel); the prompt is recomputed
  per sample.

`choose_layout` picks the first where it is valid and says which it chose.
Both stop at the decoder's final hidden states and hand only the completion
positions to `logprobs.LogprobComputer`, which never builds a
tokens x vocab tensor larger than one chunk.

Micro-batches are sized by tokens (`pack`): the padded token count of a
micro-batch stays under `grpo.max_tokens_per_microbatch`, whatever the
lengths, so a step with 8,192-token completions and one with 40-token ones
both fit the same memory.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Sequence

import torch

from .logprobs import LogprobComputer

log = logging.getLogger(__name__)

SHARED, FULL = "shared_prompt", "full_sequence"


@dataclass
class Rows:
    """What a forward needs of each sample: prompt and completion ids."""

    prompt_ids: list[int]
    completion_ids: list[int]


def decoder_and_head(model):
    """(decoder stack up to the final norm, lm_head) of a causal LM or a
    PeftModel around one; LoRA layers live inside, so both stay adapted."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inner.get_decoder(), inner.get_output_embeddings()


def is_checkpointing(model) -> bool:
    """True when transformers will checkpoint layers in this forward (then
    it also drops any KV cache passed in)."""
    decoder, _ = decoder_and_head(model)
    return decoder.training and any(getattr(m, "gradient_checkpointing", False) for m in decoder.modules())


def choose_layout(model, requested: str = "auto") -> str:
    """`auto`: shared prompt where a KV cache survives, else full sequence.
    A sharded base (sharding.py) takes full sequence: one forward per
    micro-batch on every rank, where shared prompt runs one to three."""
    if requested == FULL:
        return FULL
    from .sharding import is_sharded

    for reason, applies in (("gradient checkpointing", is_checkpointing(model)), ("model.fsdp", is_sharded(model))):
        if applies:
            if requested == SHARED:
                raise ValueError(f"grpo.forward = 'shared_prompt' cannot run with {reason}; use `auto` or `full_sequence`")
            return FULL
    return SHARED


# ------------------------------------------------------------ micro-batches

def padded_tokens(rows: Sequence[Rows], layout: str) -> int:
    """Tokens a forward of `rows` processes, padding included."""
    if not rows:
        return 0
    if layout == FULL:
        return len(rows) * max(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
    # as _shared_hidden runs them: the prefix every prompt shares once, each
    # prompt's remainder padded to the widest, each completion padded
    prompts = list({tuple(r.prompt_ids) for r in rows})
    shared = common_prefix(prompts)
    return shared + len(prompts) * (max(len(p) for p in prompts) - shared) + len(rows) * max(len(r.completion_ids) for r in rows)


def pack(rows: Sequence[Rows], layout: str, max_tokens: int | None, min_parts: int = 1) -> list[list[int]]:
    """Indices of `rows` cut into micro-batches whose padded token count is
    at most `max_tokens` (a row longer than that goes alone), and at least
    `min_parts` of them when there are enough rows (grpo.grad_accumulation).

    shared prompt: a group (rows with one prompt) stays whole where it fits,
    so its prompt is computed once. full sequence: rows are sorted by length
    so each micro-batch pads little. The packing depends only on the
    lengths, so every update of a step sees the same micro-batches."""
    total = padded_tokens(rows, layout)
    budget = max_tokens or total
    if min_parts > 1:
        budget = min(budget, max(1, math.ceil(total / min_parts)))
    if layout == FULL:
        order = sorted(range(len(rows)), key=lambda i: -(len(rows[i].prompt_ids) + len(rows[i].completion_ids)))
        units = [[i] for i in order]
    else:
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(rows):
            groups.setdefault(tuple(r.prompt_ids), []).append(i)
        units = []
        for idx in groups.values():  # a group over budget is split; its prompt then runs once per piece
            piece: list[int] = []
            for i in idx:
                if piece and padded_tokens([rows[j] for j in piece + [i]], layout) > budget:
                    units.append(piece)
                    piece = []
                piece.append(i)
            units.append(piece)
    parts: list[list[int]] = []
    current: list[int] = []
    for unit in units:
        if current and padded_tokens([rows[j] for j in current + unit], layout) > budget:
            parts.append(current)
            current = []
        current = current + unit
    if current:
        parts.append(current)
    while len(parts) < min(min_parts, len(rows)):  # the budget was approximate: halve the largest
        big = max(range(len(parts)), key=lambda k: len(parts[k]))
        half = len(parts[big]) // 2
        parts[big : big + 1] = [parts[big][:half], parts[big][half:]]
    return parts


# ------------------------------------------------------------------ forward

@dataclass
class Logprobs:
    logp: torch.Tensor  # (B, C) float32, 0 past each completion's end
    entropy: torch.Tensor | None  # (B, C) or None
    cmask: torch.Tensor  # (B, C) float, 1 on completion tokens


def _completion_mask(rows: Sequence[Rows], device) -> tuple[torch.Tensor, torch.Tensor]:
    C = max(len(r.completion_ids) for r in rows)
    c_ids = torch.zeros((len(rows), C), dtype=torch.long)
    cmask = torch.zeros((len(rows), C), dtype=torch.float32)
    for i, r in enumerate(rows):
        c_ids[i, : len(r.completion_ids)] = torch.tensor(r.completion_ids, dtype=torch.long)
        cmask[i, : len(r.completion_ids)] = 1
    return c_ids.to(device), cmask.to(device)


def _scatter(values: torch.Tensor | None, cmask: torch.Tensor) -> torch.Tensor | None:
    if values is None:
        return None
    out = torch.zeros(cmask.shape, dtype=values.dtype, device=values.device)
    return out.masked_scatter(cmask.bool(), values)


MIN_SHARED_PREFIX = 16  # tokens: below this a separate prefix forward costs more than it saves


def common_prefix(prompts: Sequence[Sequence[int]], minimum: int = MIN_SHARED_PREFIX) -> int:
    """Tokens every prompt starts with (a system prompt, a judge template),
    keeping at least one token of each prompt for its own pass; 0 when
    fewer than `minimum`."""
    if len(prompts) < 2:
        return 0
    # binary search on whole-slice comparisons (C speed): 64 prompts of 8,000
    # shared tokens took 0.15 s a batch token by token in Python
    first, lo, hi = tuple(prompts[0]), 0, min(len(p) for p in prompts) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if all(tuple(p[:mid]) == first[:mid] for p in prompts[1:]):
            lo = mid
        else:
            hi = mid - 1
    return lo if lo >= minimum else 0


def _shared_hidden(decoder, rows: Sequence[Rows], pad_id: int, device, c_ids, cmask):
    """(B, C, H) hidden states predicting each completion token: the prefix
    all prompts share (a system prompt, a judge template) in one pass, the
    distinct prompts' remainders left-padded in a second pass on its cache,
    completions on their prompt's cache. Forward and backward, the shared
    prefix costs once per micro-batch and each prompt once per group."""
    keys = list(dict.fromkeys(tuple(r.prompt_ids) for r in rows))
    where = {k: i for i, k in enumerate(keys)}
    S = common_prefix(keys)
    W = max(len(k) for k in keys) - S
    p_ids = torch.full((len(keys), S + W), pad_id, dtype=torch.long)
    p_mask = torch.zeros_like(p_ids)
    for i, k in enumerate(keys):
        p_ids[i, :S] = torch.tensor(k[:S], dtype=torch.long)
        p_mask[i, :S] = 1
        p_ids[i, S + W - (len(k) - S) :] = torch.tensor(k[S:], dtype=torch.long)
        p_mask[i, S + W - (len(k) - S) :] = 1
    p_ids, p_mask = p_ids.to(device), p_mask.to(device)
    p_pos = (p_mask.cumsum(-1) - 1).clamp(min=0)
    index = torch.tensor([where[tuple(r.prompt_ids)] for r in rows], dtype=torch.long, device=device)
    cache = None
    if S:
        head = decoder(input_ids=p_ids[:1, :S], position_ids=p_pos[:1, :S], use_cache=True)
        cache = head.past_key_values
        cache.batch_repeat_interleave(len(keys))
    out = decoder(input_ids=p_ids[:, S:], attention_mask=p_mask, position_ids=p_pos[:, S:], past_key_values=cache, use_cache=True)
    hidden = out.last_hidden_state[:, -1:][index]  # predicts completion token 0
    C = c_ids.shape[1]
    if C > 1:
        cache = out.past_key_values
        cache.batch_select_indices(index)
        mask = torch.cat([p_mask[index], cmask[:, : C - 1].long()], dim=1)
        pos = p_pos[index, -1:] + 1 + torch.arange(C - 1, device=device)
        rest = decoder(input_ids=c_ids[:, : C - 1], attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
        hidden = torch.cat([hidden, rest.last_hidden_state], dim=1)
    return hidden


def _full_hidden(decoder, rows: Sequence[Rows], pad_id: int, device, C: int):
    """(B, C, H) hidden states predicting each completion token: each row is
    prompt + completion, right-padded, no cache (checkpointing-safe)."""
    L = max(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
    ids = torch.full((len(rows), L), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    # hidden at position t predicts token t + 1: completion token j of a row
    # with prompt length p is predicted at p - 1 + j.
    gather = torch.zeros((len(rows), C), dtype=torch.long)
    for i, r in enumerate(rows):
        seq = list(r.prompt_ids) + list(r.completion_ids)
        ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[i, : len(seq)] = 1
        p = len(r.prompt_ids)
        gather[i] = (p - 1 + torch.arange(C)).clamp(max=L - 1)
    ids, mask, gather = ids.to(device), mask.to(device), gather.to(device)
    pos = torch.arange(L, device=device).expand(len(rows), L)
    out = decoder(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
    h = out.last_hidden_state
    return h.gather(1, gather.unsqueeze(-1).expand(-1, -1, h.shape[-1]))


def completion_logprobs(model, rows: Sequence[Rows], pad_id: int, layout: str, computer: LogprobComputer,
                        with_entropy: bool = False) -> Logprobs:
    """Log-probs (and entropies) of each row's completion tokens under the
    model's active adapter (or the base, inside `model.disable_adapter()`)."""
    decoder, lm_head = decoder_and_head(model)
    device = next(model.parameters()).device
    c_ids, cmask = _completion_mask(rows, device)
    if layout == SHARED:
        hidden = _shared_hidden(decoder, rows, pad_id, device, c_ids, cmask)
    else:
        hidden = _full_hidden(decoder, rows, pad_id, device, c_ids.shape[1])
    keep = cmask.bool()
    logp, entropy = computer(hidden[keep], lm_head, c_ids[keep], with_entropy=with_entropy)
    return Logprobs(_scatter(logp, cmask), _scatter(entropy, cmask), cmask)
