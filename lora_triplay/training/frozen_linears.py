"""The frozen base's Linears in training, through oneDNN on the CPU.

A LoRA update never changes the base: each base Linear needs its forward
(y = x W^T) and, in the backward, only the gradient of its input
(dx = dy W); no weight gradient. Autograd runs both as MKL GEMMs for fp32
on the CPU, the kernel the fast path left behind for rollouts
(engine/fastgemm.py: oneDNN ran the same shapes x2.2 faster). Here both
GEMMs go to oneDNN: the forward as the rollouts do, the backward on the
weight's transpose, laid out for the call and dropped after it (one layer's
weight at a time, no standing copy). Measured side by side on SmolLM2-135M
shapes (1,400 tokens, one thread): forward + backward of a 576 x 1,536
projection 77 -> 21 ms, within 3e-4 of MKL on values of ~180 (fp32 sums in
another order). bench/BENCHMARKS.md has the whole update.

Only where it applies: CPU, fp32, weight (and bias) frozen, a base not
sharded across processes; F.linear everywhere else. `ENABLED = False` (or
LORA_TRIPLAY_ONEDNN_TRAINING=0) keeps autograd's own path.
"""
from __future__ import annotations

import contextlib
import os
from functools import partial

import torch

from ..engine.fastgemm import _onednn, linear, onednn_ok, plain_linears

ENABLED = os.environ.get("LORA_TRIPLAY_ONEDNN_TRAINING", "1") != "0"


class _FrozenLinear(torch.autograd.Function):
    """y = x W^T + b with W and b frozen: the backward returns dx only."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(weight)  # a reference to the base's tensor, not a copy
        return _onednn(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        (weight,) = ctx.saved_tensors
        # dx = dy W = dy (W^T)^T: oneDNN's linear on the transpose, as a (in, out) weight
        return _onednn(grad.contiguous(), weight.t().contiguous(), None), None, None


def _applies(x, weight, bias) -> bool:
    return (x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32 and weight.dim() == 2
            and not weight.requires_grad and (bias is None or not bias.requires_grad))


def frozen_linear(module, x):
    """A frozen Linear's forward: oneDNN with its own backward while autograd
    records, fastgemm.linear (oneDNN without grad, else F.linear) otherwise."""
    if torch.is_grad_enabled() and _applies(x, module.weight, module.bias):
        return _FrozenLinear.apply(x, module.weight, module.bias)
    return linear(x, module.weight, module.bias)


@contextlib.contextmanager
def onednn_training(model):
    """Inside: the base's plain Linears (fastgemm.plain_linears: LoRA's base
    layers, projections without an adapter, the lm_head) run `frozen_linear`.
    Modules whose forward is already patched (a serving fast path) are left
    as they are."""
    from .sharding import is_sharded

    device = next(model.parameters()).device
    if not ENABLED or device.type != "cpu" or is_sharded(model) or not onednn_ok():
        yield
        return
    mods = [m for m in plain_linears(model)
            if "forward" not in m.__dict__ and m.weight.dtype == torch.float32 and not m.weight.requires_grad]
    for m in mods:
        m.forward = partial(frozen_linear, m)
    try:
        yield
    finally:
        for m in mods:
            m.__dict__.pop("forward", None)
