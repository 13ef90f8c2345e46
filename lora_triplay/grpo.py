"""GRPO on one LoRA adapter at a time, with the base as KL reference.

Why not TRL's GRPOTrainer: it owns the data loader, the generation call and
checkpointing, while a TriPlay step needs rewards that themselves call the
engine with other adapters, three roles sharing one model (each with its own
optimizer kept across iterations), step-exact resume of our run folder, and
the KL reference taken from the same model with adapters disabled (TRL 1.16
fails with `KeyError: 'default'` for a PeftModel without a `default`
adapter when beta > 0). The objective is small enough to state here in full.

Per token t of completion i in group g:
    ratio   = exp(logp - logp_old)
    surr    = min(ratio * A_i, clip(ratio, 1 - eps, 1 + eps_high) * A_i)
    kl      = exp(ref - logp) - (ref - logp) - 1          (k3 estimator)
    loss_t  = -(surr - beta * kl)
Aggregation (`loss_type`):
    grpo    mean over a sequence's tokens, then over sequences
    dapo    sum over all tokens / number of tokens in the batch
    dr_grpo sum over all tokens / (number of sequences * max_new_tokens)
With `updates_per_batch` = 1 (the default) logp_old is logp detached: the
ratio is 1 and its gradient is the policy gradient; with more updates per
rollout batch logp_old is frozen at the first pass and clipping bites.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .faults import crash_point
from .recipe import GrpoConfig


@dataclass
class Sample:
    """One completion to learn from."""

    prompt_ids: list[int]
    completion_ids: list[int]
    group: int
    reward: float | None  # None: dropped (malformed judge output)
    advantage: float = 0.0


@dataclass
class StepStats:
    loss: float = 0.0
    kl: float = 0.0
    entropy: float = 0.0
    clip_fraction: float = 0.0
    grad_norm: float = 0.0
    tokens: int = 0
    skipped: bool = False
    extra: dict[str, float] = field(default_factory=dict)


def group_advantages(rewards: list[float | None], groups: list[int], scale: bool = True, eps: float = 1e-4) -> list[float]:
    """A_i = (r_i - mean_g) / (std_g + eps), std unbiased as in TRL; without
    `scale` (Dr. GRPO) only the mean is removed. Dropped samples (None) get 0
    and do not enter their group's statistics."""
    out = [0.0] * len(rewards)
    by_group: dict[int, list[int]] = {}
    for i, (r, g) in enumerate(zip(rewards, groups)):
        if r is not None:
            by_group.setdefault(g, []).append(i)
    for idx in by_group.values():
        values = [rewards[i] for i in idx]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
        for i in idx:
            centred = rewards[i] - mean
            out[i] = centred / (std + eps) if scale else centred
    return out


def _batch_tensors(samples: list[Sample], pad_id: int, device: torch.device):
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


def token_logprobs(model, ids, mask, positions, C: int, with_entropy: bool = False, adapter_names: list[str] | None = None):
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


@dataclass
class GroupBatch:
    """Samples laid out for a forward that computes each distinct prompt
    once: prompts (left-padded) in one pass, then every completion on top of
    its prompt's KV cache. A GRPO group's G samples share one prompt, so the
    prompt (often most of the tokens) costs 1/G of a naive batch, forward
    and backward; the gradient is the same."""

    p_ids: torch.Tensor  # (U, P) distinct prompts
    p_mask: torch.Tensor
    p_pos: torch.Tensor
    index: torch.Tensor  # (B,) row -> prompt
    c_ids: torch.Tensor  # (B, C) completions, right-padded
    cmask: torch.Tensor  # (B, C) float


def group_batch(samples: list[Sample], pad_id: int, device: torch.device) -> GroupBatch:
    keys = list(dict.fromkeys(tuple(s.prompt_ids) for s in samples))
    where = {k: i for i, k in enumerate(keys)}
    P = max(len(k) for k in keys)
    p_ids = torch.full((len(keys), P), pad_id, dtype=torch.long)
    p_mask = torch.zeros_like(p_ids)
    for i, k in enumerate(keys):
        p_ids[i, P - len(k) :] = torch.tensor(k, dtype=torch.long)
        p_mask[i, P - len(k) :] = 1
    C = max(len(s.completion_ids) for s in samples)
    c_ids = torch.full((len(samples), C), pad_id, dtype=torch.long)
    cmask = torch.zeros((len(samples), C), dtype=torch.float32)
    for r, s in enumerate(samples):
        c_ids[r, : len(s.completion_ids)] = torch.tensor(s.completion_ids, dtype=torch.long)
        cmask[r, : len(s.completion_ids)] = 1
    p_pos = (p_mask.cumsum(-1) - 1).clamp(min=0)
    index = torch.tensor([where[tuple(s.prompt_ids)] for s in samples], dtype=torch.long)
    return GroupBatch(*(t.to(device) for t in (p_ids, p_mask, p_pos, index, c_ids, cmask)))


def sequence_logprobs(model, b: GroupBatch, with_entropy: bool = False):
    """Log-probs (B, C) of each completion token given its prompt."""
    out = model(input_ids=b.p_ids, attention_mask=b.p_mask, position_ids=b.p_pos, use_cache=True, logits_to_keep=1)
    logits = out.logits[:, -1:, :][b.index]  # predicts completion token 0
    C = b.c_ids.shape[1]
    if C > 1:
        cache = out.past_key_values
        cache.batch_select_indices(b.index)
        mask = torch.cat([b.p_mask[b.index], b.cmask[:, : C - 1].long()], dim=1)
        pos = b.p_pos[b.index, -1:] + 1 + torch.arange(C - 1, device=b.c_ids.device)
        rest = model(input_ids=b.c_ids[:, : C - 1], attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
        logits = torch.cat([logits, rest.logits], dim=1)
    logp_all = torch.log_softmax(logits.float(), dim=-1)
    logp = logp_all.gather(-1, b.c_ids.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


class GrpoLearner:
    """Owns one role's optimizer; `step()` does one policy update."""

    def __init__(self, model, params: list[torch.nn.Parameter], cfg: GrpoConfig, lr: float, pad_id: int):
        self.model, self.params, self.cfg, self.pad_id = model, params, cfg, pad_id
        self.optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.99))
        self.nonfinite_in_a_row = 0

    def _normaliser(self, cmask_rows: list[int]) -> list[float]:
        """Weight of each sequence's token-sum in the batch loss."""
        n = len(cmask_rows)
        if self.cfg.loss_type == "grpo":
            return [1.0 / (n * max(t, 1)) for t in cmask_rows]
        if self.cfg.loss_type == "dapo":
            total = max(sum(cmask_rows), 1)
            return [1.0 / total] * n
        return [1.0 / (n * self.cfg.max_new_tokens)] * n  # dr_grpo

    def _chunks(self, live: list[Sample]) -> list[list[Sample]]:
        """Micro-batches for gradient accumulation, cut at group borders so
        each group's shared prompt is computed once."""
        groups: dict[tuple, list[Sample]] = {}
        for smp in live:
            groups.setdefault(tuple(smp.prompt_ids), []).append(smp)
        ordered = list(groups.values())
        n = max(1, min(self.cfg.grad_accumulation, len(ordered)))
        size = math.ceil(len(ordered) / n)
        return [[x for g in ordered[i : i + size] for x in g] for i in range(0, len(ordered), size)]

    def step(self, samples: list[Sample]) -> StepStats:
        """`updates_per_batch` policy updates on one rollout batch; with more
        than one, the ratio moves away from 1 and clipping takes effect."""
        cfg, model = self.cfg, self.model
        device = next(model.parameters()).device
        live = [s for s in samples if s.completion_ids]
        stats = StepStats()
        if not live:
            stats.skipped = True
            return stats
        chunks = self._chunks(live)
        weight_of = dict(zip(map(id, live), self._normaliser([len(s.completion_ids) for s in live])))
        eps_low, eps_high = cfg.clip_epsilon, cfg.clip_epsilon_high or cfg.clip_epsilon
        old_logps: list[torch.Tensor | None] = [None] * len(chunks)
        ref_logps: list[torch.Tensor | None] = [None] * len(chunks)
        model.train()
        for update in range(cfg.updates_per_batch):
            self.optimizer.zero_grad(set_to_none=True)
            total_loss = total_kl = total_ent = total_clip = 0.0
            tokens = 0
            for c_i, part in enumerate(chunks):
                batch = group_batch(part, self.pad_id, device)
                cmask = batch.cmask
                adv = torch.tensor([s.advantage for s in part], dtype=torch.float32, device=device).unsqueeze(-1)
                logp, ent = sequence_logprobs(model, batch, with_entropy=True)
                if old_logps[c_i] is None:
                    old_logps[c_i] = logp.detach()
                ratio = torch.exp(logp - old_logps[c_i])
                surr = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv)
                per_token = -surr
                kl = torch.zeros_like(logp)
                if cfg.beta > 0:
                    if ref_logps[c_i] is None:
                        with torch.no_grad(), model.disable_adapter():
                            ref_logps[c_i], _ = sequence_logprobs(model, batch)
                    delta = ref_logps[c_i] - logp
                    kl = torch.exp(delta) - delta - 1
                    per_token = per_token + cfg.beta * kl
                seq_w = torch.tensor([weight_of[id(s)] for s in part], dtype=torch.float32, device=device).unsqueeze(-1)
                loss = (per_token * cmask * seq_w).sum()
                loss.backward()
                tokens += int(cmask.sum().item())
                total_loss += loss.item()
                total_kl += (kl.detach() * cmask).sum().item()
                total_ent += (ent * cmask).sum().item()
                clipped = ((ratio.detach() - 1).abs() > eps_low).float()
                total_clip += (clipped * cmask).sum().item()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm).item()
            if not (math.isfinite(total_loss) and math.isfinite(grad_norm)):
                # Never let a NaN reach the adapter (or the snapshot on disk).
                self.optimizer.zero_grad(set_to_none=True)
                self.nonfinite_in_a_row += 1
                stats.skipped = True
                break
            crash_point("optimizer")
            self.optimizer.step()
            if update == 0:  # report the first update: the on-policy one
                stats.loss, stats.grad_norm, stats.tokens = total_loss, grad_norm, tokens
                stats.kl = total_kl / max(tokens, 1)
                stats.entropy = total_ent / max(tokens, 1)
                stats.clip_fraction = total_clip / max(tokens, 1)
            stats.extra["clip_fraction_last_update"] = total_clip / max(tokens, 1)
        else:
            self.nonfinite_in_a_row = 0
        if stats.skipped:
            stats.loss, stats.grad_norm = total_loss, grad_norm
        self.optimizer.zero_grad(set_to_none=True)
        model.eval()
        return stats
