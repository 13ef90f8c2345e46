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
    grpo        mean over a sequence's tokens, then over sequences
    token_mean  sum over all tokens / number of tokens in the batch (DAPO's
                loss; its clip-higher is clip_epsilon_high)
    dr_grpo     sum over all tokens / (number of sequences * max_new_tokens),
                advantages not divided by the group's std (Dr. GRPO)
With `updates_per_batch` = 1 (the default) logp_old is logp detached: the
ratio is 1 and its gradient is the policy gradient; with more updates per
rollout batch logp_old is frozen at the first pass and clipping bites.

Several processes (distributed.py): each rank passes its own block of
groups; the normaliser counts every rank's sequences and tokens and the
gradients are summed across ranks before clipping, so each rank takes the
step one process would take on the whole batch.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..core.distributed import Collective
from ..core.faults import crash_point
from ..engine import fastpath
from ..recipe import GrpoConfig
from . import supervised
from .advantages import Sample
from .forward import FULL, SHARED, Logprobs, choose_layout, completion_logprobs, pack
from .frozen_linears import onednn_training
from .host_memory import keep_freed_memory
from .logprobs import LogprobComputer, logit_transform
from .sharding import is_sharded
from .supervised import ChoiceExample

log = logging.getLogger(__name__)


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


class GrpoLearner:
    """Owns one role's optimizer; `step()` does one policy update.

    The forward layout (shared prompt or full sequence, see forward.py) is
    chosen per step from the model's memory settings and logged when it
    changes; log-probs come from `logprobs.LogprobComputer` (chunked, or a
    fused kernel where one is installed on CUDA)."""

    def __init__(self, model, params: list[torch.nn.Parameter], cfg: GrpoConfig, lr: float, pad_id: int,
                 computer: LogprobComputer | None = None, max_new_tokens: int | None = None,
                 collective: Collective | None = None):
        self.model, self.params, self.cfg, self.pad_id = model, params, cfg, pad_id
        self.collective = collective or Collective(world=1)
        self.max_new_tokens = max_new_tokens or cfg.max_new_tokens  # dr_grpo's constant normaliser
        self.lr = lr
        self.last_lr = lr  # the rate of the last optimizer step (warmup), for the metrics row
        self.optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.99))
        self.nonfinite_in_a_row = 0
        if computer is None:
            config = getattr(model, "config", None)
            computer = LogprobComputer(cfg.logprob_kernel, cfg.logprob_chunk_tokens, logit_transform(config) if config is not None else None)
        self.computer = computer
        if next(model.parameters()).device.type == "cpu":
            keep_freed_memory()  # an update's activations are allocated again by the next one (host_memory.py)
        self.layout: str | None = None
        # a sharded base (sharding.py): the one-token sample of the micro-batches
        # a rank runs only to keep step with busier ranks, and how many it ran
        self._dummy = Sample([pad_id], [pad_id], group=-1, reward=None)
        self.lockstep_dummies = 0

    def _normaliser(self, cmask_rows: list[int]) -> list[float]:
        """Weight of each sequence's token-sum in the batch loss; the batch
        is every rank's sequences together."""
        n_all, tokens_all = self.collective.sum_floats([len(cmask_rows), sum(cmask_rows)])
        n = len(cmask_rows)
        if self.cfg.loss_type == "grpo":
            return [1.0 / (n_all * max(t, 1)) for t in cmask_rows]
        if self.cfg.loss_type == "token_mean":
            return [1.0 / max(tokens_all, 1)] * n
        return [1.0 / (n_all * self.max_new_tokens)] * n  # dr_grpo

    def _reduce(self, totals: dict[str, float]) -> dict[str, float]:
        """Sum the active adapter's gradients and the step's totals over ranks."""
        if self.collective.world == 1:
            return totals
        for p in self.params:
            if p.grad is None:  # a rank whose samples did not reach this tensor
                p.grad = torch.zeros_like(p)
        self.collective.sum_tensors_([p.grad for p in self.params])
        keys = sorted(totals)
        summed = dict(zip(keys, self.collective.sum_floats([totals[k] for k in keys])))
        summed["tokens"] = int(summed["tokens"])
        return summed

    def updates_done(self) -> int:
        """Optimizer steps this role has taken (AdamW's own count, so it
        survives a resume with the optimizer state)."""
        for state in self.optimizer.state.values():
            step = state.get("step")
            if step is not None:
                return int(step.item() if torch.is_tensor(step) else step)
        return 0

    def current_lr(self) -> float:
        """The rate of the next optimizer step: `grpo.warmup_steps` ramps it
        linearly from lr / warmup to lr over the role's first steps."""
        warmup, done = self.cfg.warmup_steps, self.updates_done()
        return self.lr if done >= warmup else self.lr * (done + 1) / warmup

    def place_state(self, device: torch.device | str) -> None:
        """Move this role's optimizer state (AdamW's two moments) to `device`:
        on a GPU only the active role's state needs to be there."""
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if torch.is_tensor(value) and value.device != torch.device(device) and key != "step":
                    state[key] = value.to(device, non_blocking=True)

    def _choose_layout(self) -> str:
        layout = choose_layout(self.model, self.cfg.forward)
        if layout != self.layout:
            why = f"grpo.forward = {self.cfg.forward}"
            if layout == FULL and self.cfg.forward == "auto":
                why = "the base is sharded: one forward per micro-batch on every rank" if is_sharded(self.model) \
                    else "gradient checkpointing drops the KV cache"
            if layout == SHARED:
                why = "each prompt computed once per group"
            log.info("GRPO forward: %s (%s); log-probs in chunks of %d tokens", layout, why, self.cfg.logprob_chunk_tokens)
            self.layout = layout
        return layout

    def _logprobs(self, part: list[Sample], layout: str, with_entropy: bool = False) -> Logprobs:
        return completion_logprobs(self.model, part, self.pad_id, layout, self.computer, with_entropy=with_entropy)

    def _learns_from(self, s: Sample) -> bool:
        """Whether a sample enters the loss (and its normaliser). A dropped
        sample (reward None: the judge's output was malformed) does not: with
        advantage 0 it would still dilute every other sample's weight and
        pull its completion towards the base through the KL term."""
        if not s.completion_ids or s.reward is None:
            return False
        if self.cfg.mask_truncated and s.truncated:
            return False
        return not (self.cfg.drop_flat_groups and s.flat)

    def _plan(self, samples: list[Sample]):
        live = [s for s in samples if self._learns_from(s)]
        layout = self._choose_layout()
        parts = pack(live, layout, self.cfg.max_tokens_per_microbatch, self.cfg.grad_accumulation)
        weights = self._normaliser([len(s.completion_ids) for s in live])
        if is_sharded(self.model):
            # every rank runs as many micro-batches as the busiest one (each
            # forward and backward all-gathers the sharded layers): the extra
            # ones are a one-token dummy of weight 0, left out of the totals
            most = self.collective.max_int(len(parts))
            if most > len(parts):
                live = [*live, self._dummy]
                weights = [*weights, 0.0]
                self.lockstep_dummies += most - len(parts)
                parts = [*parts, *([[len(live) - 1]] * (most - len(parts)))]
        return live, layout, parts, weights

    def _accumulate(self, live, layout, parts, weights, old_logps, ref_logps, first: bool) -> dict[str, float]:
        """Forward and backward over every micro-batch: the gradient of the
        whole batch's loss ends up in the parameters' .grad."""
        cfg, model = self.cfg, self.model
        device = next(model.parameters()).device
        eps_low, eps_high = cfg.clip_epsilon, cfg.clip_epsilon_high or cfg.clip_epsilon
        totals = dict(loss=0.0, kl=0.0, entropy=0.0, clip=0.0, tokens=0)
        for c_i, idx in enumerate(parts):
            part = [live[i] for i in idx]
            adv = torch.tensor([s.advantage for s in part], dtype=torch.float32, device=device).unsqueeze(-1)
            out = self._logprobs(part, layout, with_entropy=first)
            logp, cmask = out.logp, out.cmask
            if old_logps[c_i] is None:
                old_logps[c_i] = logp.detach()
            ratio = torch.exp(logp - old_logps[c_i])
            surr = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv)
            per_token = -surr
            kl = torch.zeros_like(logp)
            if cfg.beta > 0:
                if ref_logps[c_i] is None:
                    with torch.no_grad(), model.disable_adapter():
                        ref_logps[c_i] = self._logprobs(part, layout).logp
                # k3, with the log-ratio and the estimate clamped as verl does:
                # one token far off the base must not swamp the step
                delta = (ref_logps[c_i] - logp).clamp(-20.0, 20.0)
                kl = torch.exp(delta) - delta - 1
                if cfg.kl_clamp is not None:
                    kl = kl.clamp(max=cfg.kl_clamp)
                per_token = per_token + cfg.beta * kl
            seq_w = torch.tensor([weights[i] for i in idx], dtype=torch.float32, device=device).unsqueeze(-1)
            loss = (per_token * cmask * seq_w).sum()
            loss.backward()
            if part[0] is self._dummy:  # a rank keeping step (_plan): nothing to count
                continue
            totals["tokens"] += int(cmask.sum().item())
            totals["loss"] += loss.item()
            totals["kl"] += (kl.detach() * cmask).sum().item()
            if out.entropy is not None:
                totals["entropy"] += (out.entropy * cmask).sum().item()
            r = ratio.detach()
            totals["clip"] += (((r < 1 - eps_low) | (r > 1 + eps_high)).float() * cmask).sum().item()  # outside the clip range
        return totals

    def gradients(self, samples: list[Sample]) -> list[torch.Tensor]:
        """The on-policy gradient of one step's loss, without an optimizer
        step (for tests and benchmarks: every path must give the same)."""
        self.model.train()  # before _plan: the layout depends on the training mode
        live, layout, parts, weights = self._plan(samples)
        self.optimizer.zero_grad(set_to_none=True)
        try:
            self._reduce(self._accumulate(live, layout, parts, weights, [None] * len(parts), [None] * len(parts), first=True))
        finally:
            self.model.eval()
        grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in self.params]
        self.optimizer.zero_grad(set_to_none=True)
        return grads

    def step(self, samples: list[Sample], examples: Sequence[ChoiceExample] = (), smoothing: float = 0.0) -> StepStats:
        """`updates_per_batch` policy updates on one rollout batch; with more
        than one, the ratio moves away from 1 and clipping takes effect.
        `examples`: labelled forced choices whose mean cross-entropy
        (supervised.py, label smoothing `smoothing`) joins the same updates
        (eval's `sft` and `sft+grpo` objectives)."""
        model = self.model
        stats = StepStats()
        n_live, n_examples = self.collective.sum_floats([sum(1 for s in samples if self._learns_from(s)), len(examples)])
        if not n_live + n_examples:
            stats.skipped = True  # on every rank: nothing to learn from anywhere
            return stats
        model.train()
        with onednn_training(model), fastpath.attention(model, fastpath.training_attention(model)):
            self._updates(stats, samples, examples, smoothing, n_examples)
        self.optimizer.zero_grad(set_to_none=True)
        model.eval()
        return stats

    def _updates(self, stats: StepStats, samples, examples, smoothing: float, n_examples: float) -> None:
        cfg = self.cfg
        live, layout, parts, weights = self._plan(samples)
        width = self.collective.max_int(max((len(e.choices) for e in examples), default=0)) if n_examples else 0
        stats.extra["microbatches"] = float(len(parts))
        old_logps: list[torch.Tensor | None] = [None] * len(parts)
        ref_logps: list[torch.Tensor | None] = [None] * len(parts)
        total_loss, grad_norm = 0.0, 0.0
        for update in range(cfg.updates_per_batch):
            self.optimizer.zero_grad(set_to_none=True)
            t = self._accumulate(live, layout, parts, weights, old_logps, ref_logps, first=update == 0)
            if n_examples:
                t.update(supervised.accumulate(self, list(examples), layout, n_examples, smoothing, width))
            t = self._reduce(t)
            total_loss, tokens = t["loss"] + t.get("ce_loss", 0.0) / max(n_examples, 1), max(t["tokens"], 1)
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm).item()
            if not (math.isfinite(total_loss) and math.isfinite(grad_norm)):
                # Never let a NaN reach the adapter (or the snapshot on disk).
                self.optimizer.zero_grad(set_to_none=True)
                if update:  # the earlier updates changed the adapter: keep them, and the step counts as taken
                    stats.extra["nonfinite_at_update"] = float(update)
                    log.warning("update %d of %d had a non-finite loss or gradient: the step keeps the first %d",
                                update + 1, cfg.updates_per_batch, update)
                    self.nonfinite_in_a_row = 0
                    return
                self.nonfinite_in_a_row += 1
                stats.skipped = True
                break
            crash_point("optimizer")
            self.last_lr = self.current_lr()
            for group in self.optimizer.param_groups:
                group["lr"] = self.last_lr
            self.optimizer.step()
            if update == 0:  # report the first update: the on-policy one
                stats.loss, stats.grad_norm, stats.tokens = total_loss, grad_norm, t["tokens"]
                stats.kl, stats.entropy, stats.clip_fraction = t["kl"] / tokens, t["entropy"] / tokens, t["clip"] / tokens
                if n_examples:  # the cross-entropy and the argmax accuracy before the update
                    stats.extra.update(ce_loss=t["ce_loss"] / n_examples, ce_accuracy=t["ce_correct"] / n_examples,
                                       **{f"ce_pick_rate_{k}": t[f"ce_pick_{k}"] / n_examples for k in range(width) if width > 1})
            stats.extra["clip_fraction_last_update"] = t["clip"] / tokens
        else:
            self.nonfinite_in_a_row = 0
        if stats.skipped:
            stats.loss, stats.grad_norm = total_loss, grad_norm
