"""Log-probabilities of chosen tokens without a B x T x V tensor.

A policy update needs, for every completion token, log p(token) (and, for
logging, the entropy of the distribution). The plain way, a float32
`log_softmax` over the whole vocabulary for every token, costs
rows x tokens x vocab x 4 bytes: 32 x 8,192 x 151,936 x 4 = 159 GB for one
paper-scale micro-batch, before its backward copy. Here the final hidden
states are turned into log-probs a chunk of tokens at a time:

    logp_t = logit_t[token_t] - logsumexp(logit_t)

Each chunk's logits live only inside a checkpointed function, so the
backward recomputes them chunk by chunk. For a plain linear head (Qwen3,
Llama) a small autograd function does this in place: peak memory is about
two chunk x vocab float32 tensors (~0.6 GB at 512 tokens and Qwen3's
vocabulary), whatever the sequence length; any other head (LoRA on
lm_head, logit soft-capping) goes through a checkpointed chunk instead. On CUDA with liger-kernel installed, its fused
linear cross-entropy (matmul and softmax in one kernel, never writing the
logits) can do the same; it is checked against this path on the first batch
it sees and dropped, with a warning, if the two disagree.
"""
from __future__ import annotations

import logging
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

from ..errors import UserError
from .precision import widened

log = logging.getLogger(__name__)

DEFAULT_CHUNK_TOKENS = 512


def logit_transform(config) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """What some architectures apply between lm_head and the softmax
    (Gemma-2 soft-capping, Cohere's logit scale); None for Qwen3/Llama."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    cap = getattr(text, "final_logit_softcapping", None)
    scale = getattr(text, "logit_scale", None)
    if not cap and scale in (None, 1, 1.0):
        return None

    def transform(logits: torch.Tensor) -> torch.Tensor:
        if scale not in (None, 1, 1.0):
            logits = logits * scale
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    return transform


class _LinearLogprob(torch.autograd.Function):
    """log softmax(h W^T + b)[target] for one chunk of a plain nn.Linear
    head, without keeping the logits: forward saves h and the logsumexp
    (one float per token); backward recomputes the logits once and turns
    them into their own gradient in place, softmax(z) * -g + g at the
    target. Peak: about two chunk x vocab float32 tensors, forward or
    backward (the generic checkpointed path below keeps four or five)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, with_entropy: bool):
        logits = widened(torch.nn.functional.linear(hidden, weight, bias))
        selected = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        top = logits.amax(-1, keepdim=True)
        logits.sub_(top).exp_()  # in place: exp(z - max)
        total = logits.sum(-1, keepdim=True)
        lse = (top + total.log()).squeeze(-1)
        entropy = None
        if with_entropy:  # -sum p log p with p = exp(z - max) / total, in place
            logits.div_(total)
            entropy = -torch.special.xlogy(logits, logits).sum(-1)
        del logits
        ctx.save_for_backward(hidden, weight, bias if bias is not None else torch.empty(0), targets, lse)
        ctx.has_bias = bias is not None
        return selected - lse, entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        grad = widened(torch.nn.functional.linear(hidden, weight, bias if ctx.has_bias else None))
        grad.sub_(lse.unsqueeze(-1)).exp_().mul_(-grad_logp.unsqueeze(-1))  # d logp / d z = onehot - softmax
        grad.scatter_add_(-1, targets.unsqueeze(-1), grad_logp.unsqueeze(-1).to(grad.dtype))
        grad = grad.to(weight.dtype)
        grad_hidden = grad @ weight if ctx.needs_input_grad[0] else None
        grad_weight = grad.t() @ hidden if ctx.needs_input_grad[1] else None
        grad_bias = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_hidden, grad_weight, grad_bias, None, None


def _plain_linear(module) -> bool:
    """A head the fused-in-torch path can read directly (not LoRA-wrapped,
    not quantized)."""
    return type(module) is torch.nn.Linear


def _chunk_logprobs(lm_head, transform, hidden: torch.Tensor, targets: torch.Tensor, with_entropy: bool):
    logits = widened(lm_head(hidden))
    if transform is not None:
        logits = transform(logits)
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return logp, None
    with torch.no_grad():  # a metric: no gradient, no saved tensors
        probs = torch.softmax(logits, dim=-1)
        entropy = lse - (probs * logits).sum(-1)
    return logp, entropy


def chunked_logprobs(
    hidden: torch.Tensor,
    lm_head: torch.nn.Module,
    targets: torch.Tensor,
    *,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    with_entropy: bool = False,
    transform: Callable | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(targets[i] | hidden[i]) for hidden (N, H) and targets (N,),
    `chunk_tokens` rows of logits at a time. Differentiable in `hidden` (and
    in lm_head's parameters, if they train); returns (logp (N,), entropy
    (N,) or None), both float32."""
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"chunked_logprobs needs hidden (N, H) and targets (N,), got {tuple(hidden.shape)} and {tuple(targets.shape)}")
    grad = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in lm_head.parameters()))
    direct = transform is None and _plain_linear(lm_head)
    logps, ents = [], []
    for start in range(0, hidden.shape[0], chunk_tokens):
        h, t = hidden[start : start + chunk_tokens], targets[start : start + chunk_tokens]
        if direct:
            lp, ent = _LinearLogprob.apply(h, lm_head.weight, lm_head.bias, t, with_entropy)
        elif grad:
            # Recomputed in backward: the chunk's logits are never kept.
            lp, ent = checkpoint(_chunk_logprobs, lm_head, transform, h, t, with_entropy, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs(lm_head, transform, h, t, with_entropy)
        logps.append(lp)
        if ent is not None:
            ents.append(ent)
    empty = hidden.new_zeros(0, dtype=torch.float64 if hidden.dtype == torch.float64 else torch.float32)
    logp = torch.cat(logps) if logps else empty
    entropy = (torch.cat(ents) if ents else empty) if with_entropy else None
    return logp, entropy


# ------------------------------------------------------------ fused kernel

def _liger_logprobs(hidden: torch.Tensor, lm_head: torch.nn.Module, targets: torch.Tensor) -> torch.Tensor:
    """-CE per token from liger-kernel's fused linear cross-entropy."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    bias = getattr(lm_head, "bias", None)
    loss = liger_fused_linear_cross_entropy(hidden, lm_head.weight, targets, bias, reduction="none")
    loss = loss[0] if isinstance(loss, tuple) else loss
    return -loss.float()


def liger_available(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        from liger_kernel.transformers.functional import (
            liger_fused_linear_cross_entropy,  # noqa: F401
        )
    except Exception:
        return False
    return True


class LogprobComputer:
    """Picks the log-prob kernel once per run and keeps the choice honest.

    `kernel`: "chunked" (always available), "liger" (fused; CUDA only), or
    "auto" (liger when installed on CUDA, else chunked). A fused kernel is
    compared with the chunked path on the first call, values and gradient
    on a slice of real hidden states; if they differ by more than rounding
    (relative L2 error over `tol`: 1e-4 in float32, 3e-2 in bf16) it is
    dropped for the rest of the run with a warning. Entropy always
    comes from the chunked path (under no_grad) when the fused one is used,
    since liger does not return it.
    """

    def __init__(self, kernel: str = "auto", chunk_tokens: int = DEFAULT_CHUNK_TOKENS, transform=None,
                 fused: Callable | None = None, tol: float | None = None):
        self.kernel, self.chunk_tokens, self.transform, self.tol = kernel, chunk_tokens, transform, tol
        self._fused = fused
        self._checked = False
        self.active = "chunked"

    def _resolve(self, device: torch.device) -> None:
        if self._checked:
            return
        want = self.kernel
        if want == "auto":
            want = "liger" if (self._fused is not None or liger_available(device)) and self.transform is None else "chunked"
        if want == "liger" and self._fused is None:
            if not liger_available(device):
                raise UserError("grpo.logprob_kernel = 'liger' needs CUDA and `pip install liger-kernel`; set grpo.logprob_kernel=chunked")
            self._fused = _liger_logprobs
        self.active = want

    def _agrees(self, hidden, lm_head, targets) -> tuple[bool, float]:
        n = min(64, hidden.shape[0])
        h = hidden[:n].detach().clone().requires_grad_(True)
        t = targets[:n]
        weights = torch.linspace(-1.0, 1.0, n, device=h.device)
        ref, _ = chunked_logprobs(h, lm_head, t, chunk_tokens=self.chunk_tokens, transform=self.transform)
        (g_ref,) = torch.autograd.grad((ref * weights).sum(), h)
        h2 = hidden[:n].detach().clone().requires_grad_(True)
        got = self._fused(h2, lm_head, t)
        (g_got,) = torch.autograd.grad((got * weights).sum(), h2)
        def rel(a, b):  # relative L2 error: rounding is ~1e-3 (bf16), a wrong kernel is O(1)
            a, b = a.float(), b.float()
            return ((a - b).norm() / a.norm().clamp_min(1e-12)).item()

        err = max(rel(ref, got), rel(g_ref, g_got))
        tol = self.tol if self.tol is not None else (1e-4 if hidden.dtype == torch.float32 else 3e-2)
        return err <= tol, err

    def __call__(self, hidden: torch.Tensor, lm_head, targets: torch.Tensor, with_entropy: bool = False):
        self._resolve(hidden.device)
        if self.active == "liger" and not self._checked and hidden.shape[0]:
            ok, err = self._agrees(hidden, lm_head, targets)
            if ok:
                log.info("log-probs: fused kernel (liger) agrees with the chunked path (relative error %.2e); using it", err)
            else:
                log.warning("log-probs: fused kernel differs from the chunked path (relative error %.2e); using the chunked path", err)
                self.active = "chunked"
        self._checked = True
        if self.active == "liger":
            logp = self._fused(hidden, lm_head, targets)
            entropy = None
            if with_entropy:
                with torch.no_grad():
                    _, entropy = chunked_logprobs(hidden.detach(), lm_head, targets, chunk_tokens=self.chunk_tokens, with_entropy=True)
            return logp, entropy
        return chunked_logprobs(hidden, lm_head, targets, chunk_tokens=self.chunk_tokens, with_entropy=with_entropy, transform=self.transform)
