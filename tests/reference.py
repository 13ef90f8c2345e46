"""Naive reference paths the fast ones are tested against (and benchmarked
against in bench/): every row padded in full, one float32 log-softmax over
the whole vocabulary. Correct and simple; too slow and too big for runs."""
from __future__ import annotations

import torch


def batch_tensors(samples, pad_id: int, device: torch.device):
    """Prompts left-padded to P, completions right-padded to C, so every
    completion starts at column P and `logits_to_keep=C+1` covers them all."""
    P = max(len(s.prompt_ids) for s in samples)
    C = max(len(s.completion_ids) for s in samples)
    ids = torch.full((len(samples), P + C), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    cmask = torch.zeros((len(samples), C), dtype=torch.float32)
    for row, s in enumerate(samples):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        ids[row, P - p : P] = torch.tensor(s.prompt_ids)
        ids[row, P : P + c] = torch.tensor(s.completion_ids)
        mask[row, P - p : P + c] = 1
        cmask[row, :c] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), positions.to(device), cmask.to(device), C


def token_logprobs(model, ids, mask, positions, C: int, with_entropy: bool = False, adapter_names=None):
    """Log-probs (and entropies) of the last C tokens of each row."""
    extra = {"adapter_names": adapter_names} if adapter_names is not None else {}
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=C + 1, use_cache=False, **extra)
    logits = out.logits[:, :-1, :].float()
    logp_all = torch.log_softmax(logits, dim=-1)
    targets = ids[:, -C:]
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def naive_logprobs(model, samples, pad_id: int, with_entropy: bool = False, adapter_names=None):
    """(logp (B, C), entropy, cmask) for samples, the naive way."""
    device = next(model.parameters()).device
    ids, mask, pos, cmask, C = batch_tensors(samples, pad_id, device)
    logp, ent = token_logprobs(model, ids, mask, pos, C, with_entropy, adapter_names)
    return logp * cmask, (ent * cmask if ent is not None else None), cmask
