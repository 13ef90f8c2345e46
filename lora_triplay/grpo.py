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
One policy update per rollout batch, so logp_old is logp detached (the ratio
is 1 but its gradient is the policy gradient).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

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

    def step(self, samples: list[Sample]) -> StepStats:
        cfg, model = self.cfg, self.model
        device = next(model.parameters()).device
        live = [s for s in samples if s.completion_ids]
        stats = StepStats()
        if not live:
            stats.skipped = True
            return stats
        weights = self._normaliser([len(s.completion_ids) for s in live])
        eps_low, eps_high = cfg.clip_epsilon, cfg.clip_epsilon_high or cfg.clip_epsilon
        chunks = max(1, min(cfg.grad_accumulation, len(live)))
        size = math.ceil(len(live) / chunks)
        model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total_loss = total_kl = total_ent = total_clip = 0.0
        tokens = 0
        for start in range(0, len(live), size):
            part, w = live[start : start + size], weights[start : start + size]
            ids, mask, pos, cmask, C = _batch_tensors(part, self.pad_id, device)
            adv = torch.tensor([s.advantage for s in part], dtype=torch.float32, device=device).unsqueeze(-1)
            logp, ent = token_logprobs(model, ids, mask, pos, C, with_entropy=True)
            old = logp.detach()
            ratio = torch.exp(logp - old)
            surr = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv)
            per_token = -surr
            kl = torch.zeros_like(logp)
            if cfg.beta > 0:
                with torch.no_grad(), model.disable_adapter():
                    ref, _ = token_logprobs(model, ids, mask, pos, C)
                delta = ref - logp
                kl = torch.exp(delta) - delta - 1
                per_token = per_token + cfg.beta * kl
            seq_w = torch.tensor(w, dtype=torch.float32, device=device).unsqueeze(-1)
            loss = (per_token * cmask * seq_w).sum()
            loss.backward()
            n_tok = cmask.sum().item()
            tokens += int(n_tok)
            total_loss += loss.item()
            total_kl += (kl.detach() * cmask).sum().item()
            total_ent += (ent * cmask).sum().item()
            clipped = ((ratio.detach() - 1).abs() > eps_low).float()
            total_clip += (clipped * cmask).sum().item()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm).item()
        stats.loss, stats.grad_norm, stats.tokens = total_loss, grad_norm, tokens
        stats.kl = total_kl / max(tokens, 1)
        stats.entropy = total_ent / max(tokens, 1)
        stats.clip_fraction = total_clip / max(tokens, 1)
        if not (math.isfinite(total_loss) and math.isfinite(grad_norm)):
            # Never let a NaN reach the adapter (or the snapshot on disk).
            self.optimizer.zero_grad(set_to_none=True)
            self.nonfinite_in_a_row += 1
            stats.skipped = True
            return stats
        self.nonfinite_in_a_row = 0
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        model.eval()
        return stats
