"""What makes the HF engine's rollouts fast without changing a number.

Measured on SmolLM2-135M, 32 rows, one CPU thread (bench/BENCHMARKS.md): a
decode step took 407 ms against a ~90 ms compute floor. Four costs, each
removed here, each tested against the plain path (same tokens, log-probs
within 1e-4):

- **multi-LoRA in two GEMMs** (`MultiLora`): PEFT serves a mixed batch by
  looping over adapters inside every LoRA layer (sub-batch gathers, two
  small matmuls per adapter, per layer, per step). Here the adapters'
  A matrices are stacked once per `generate` call, so each layer adds
  ((x @ A_all^T) * row_mask) @ B_all^T: two GEMMs whatever the mix, a row's
  mask selecting its own adapter's slice (all zero for `base`), PEFT's
  scaling folded into B. PEFT keeps owning training and the saved format.
- **a KV cache that does not copy itself** (`ReservedLayer`): transformers'
  dynamic cache concatenates every layer's keys and values at every step
  (the whole cache, every token); this one writes into a buffer reserved for
  prompt + max_new_tokens and hands out views.
- **grouped-query attention without repeating K/V** (`decode_attention`):
  for one query token, SDPA with a padding mask repeats each key/value head
  once per query head it serves (a copy of the whole cache per layer per
  step); here the query heads are grouped onto their key/value head and
  attend with two batched matmuls. Longer queries (prefill, choice trees)
  and every update on the CPU (`TRAIN_ATTENTION`) go to `grouped_sdpa`:
  SDPA's own grouped-query attention under a mask, where transformers
  would repeat the heads (the copy again, and its gradient in an update).
- **the base's GEMMs** (`fastgemm.py`): oneDNN instead of MKL for fp32 on
  CPU, q/k/v and gate/up as one GEMM each (with their LoRA deltas), every
  LoRA layer without a hook, the lm_head in column blocks.
`ONEDNN`, `FUSE` and `LM_HEAD_BLOCK` turn the last one off part by part
(bench_roofline.py --compare runs the fast path with and without it).
"""
from __future__ import annotations

import contextlib
import os
from functools import partial

import torch

from ..training.precision import widened
from .fastgemm import blocked_lm_head, find_groups, onednn_linears, onednn_ok, plain_linears

DECODE_ATTENTION = "lora_triplay_decode"
TRAIN_ATTENTION = "lora_triplay_grouped_sdpa"

# Module-level switches, read when serving starts; bench_roofline.py turns
# them off for its side-by-side "before" (the numbers are the same either way).
ONEDNN = True  # base GEMMs (every plain Linear of the base) through oneDNN
FUSE = True  # q/k/v and gate/up as one GEMM each, every LoRA layer without a hook
LM_HEAD_BLOCK = 4096  # columns per lm_head GEMM; 0: transformers' own lm_head
GROUPED_SDPA = os.environ.get("LORA_TRIPLAY_GROUPED_SDPA", "1") != "0"  # grouped_sdpa; off: transformers' SDPA


# ------------------------------------------------------------ multi-LoRA

class MultiLora:
    """Serve several LoRA adapters of one PeftModel in one batch."""

    def __init__(self, model):
        from peft.tuners.lora import LoraLayer

        self.model = model
        self.layers = [m for m in model.modules() if isinstance(m, LoraLayer) and hasattr(m, "lora_A")]
        self.supported = bool(self.layers) and all(
            not getattr(m, "use_dora", {}).get(name, False) for m in self.layers for name in m.lora_A
        )
        from ..training.sharding import is_sharded

        # a sharded base owns its parameters' storage (FSDP's flat params)
        self.groups = find_groups(model) if self.supported and not is_sharded(model) else []
        # the base's Linears do not change when adapters come and go (their
        # own A/B are not among them): found once, not per generate call
        self.linears = plain_linears(model) if self.supported else []

    @contextlib.contextmanager
    def serving(self, adapters: list[str]):
        """Inside: PEFT's own LoRA paths are off and every LoRA layer adds the
        stacked adapters `adapters` (PEFT names; `__base__` has no slice).
        Call `rows(index)` before each forward: index[i] is row i's position
        in `adapters`."""
        names = [a for a in adapters if a != "__base__"]
        stacks = {}
        for layer in self.layers:
            present = [n for n in names if n in layer.lora_A]
            if not present:
                continue
            A = torch.cat([layer.lora_A[n].weight for n in present], 0)  # (n*r, in)
            B = torch.cat([layer.lora_B[n].weight * layer.scaling[n] for n in present], 1)  # (out, n*r)
            spans = {n: layer.lora_A[n].weight.shape[0] for n in present}
            stacks[layer] = (A, B, present, spans)
        self._stacks = stacks
        self._adapters = list(adapters)
        self._masks: dict = {}
        handles, patched = [], []
        try:
            with self.model.disable_adapter():  # also unmerges a merged adapter before the weights are read
                use_onednn = ONEDNN and onednn_ok()
                if use_onednn:
                    patched += onednn_linears(self.linears)
                if FUSE:
                    for group in self.groups:
                        patched += group.serve(self, use_onednn)
                done = {id(m) for m in patched}
                handles = [layer.register_forward_hook(self._hook) for layer in stacks if id(layer) not in done]
                if LM_HEAD_BLOCK:
                    patched += blocked_lm_head(self.model, LM_HEAD_BLOCK, use_onednn)
                yield self
        finally:
            for h in handles:
                h.remove()
            for module in patched:
                module.__dict__.pop("forward", None)
            self._stacks, self._masks = {}, {}

    def rows(self, index: torch.Tensor) -> None:
        """Set which adapter each row of the next forwards uses."""
        self._row_index = index
        self._masks = {}

    def _mask(self, layer, device, dtype) -> torch.Tensor:
        A, _, present, spans = self._stacks[layer]
        key = (tuple(present), dtype)
        mask = self._masks.get(key)
        if mask is None:
            cols = torch.zeros(len(self._adapters), A.shape[0], dtype=dtype, device=device)
            start = 0
            for n in present:
                cols[self._adapters.index(n), start : start + spans[n]] = 1
                start += spans[n]
            mask = cols[self._row_index]  # (rows, n*r)
            self._masks[key] = mask
        return mask

    def _hook(self, layer, args, output):
        x = args[0]
        A, B, _, _ = self._stacks[layer]
        mask = self._mask(layer, x.device, A.dtype)
        h = x.to(A.dtype) @ A.t()
        h = h * (mask if h.dim() == 2 else mask.unsqueeze(1))
        return output + (h @ B.t()).to(output.dtype)


# ------------------------------------------------------------ the KV cache

def _reserved_layer_class():
    from transformers.cache_utils import DynamicLayer

    class ReservedLayer(DynamicLayer):
        """A dynamic cache layer whose keys/values are views into a buffer
        with room for `capacity` tokens: an update writes in place."""

        def __init__(self, capacity: int):
            super().__init__()
            self.capacity = capacity
            self.length = 0

        def _views(self) -> None:
            self.keys = self._k[:, :, : self.length]
            self.values = self._v[:, :, : self.length]

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.dtype, self.device = key_states.dtype, key_states.device
                B, H, _, D = key_states.shape
                cap = max(self.capacity, key_states.shape[-2])
                self._k = key_states.new_empty((B, H, cap, D))
                self._v = value_states.new_empty((B, value_states.shape[1], cap, value_states.shape[-1]))
                self.is_initialized = True
            n = key_states.shape[-2]
            if self.length + n > self._k.shape[2]:  # more than reserved: grow (amortised doubling)
                grow = max(self.length + n, 2 * self._k.shape[2])
                self._k = torch.cat([self._k[:, :, : self.length], self._k.new_empty(*self._k.shape[:2], grow - self.length, self._k.shape[3])], 2)
                self._v = torch.cat([self._v[:, :, : self.length], self._v.new_empty(*self._v.shape[:2], grow - self.length, self._v.shape[3])], 2)
            self._k[:, :, self.length : self.length + n] = key_states
            self._v[:, :, self.length : self.length + n] = value_states
            self.length += n
            self._views()
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.length

        def batch_repeat_interleave(self, repeats: int) -> None:
            if self.length:
                self._k = self._k.repeat_interleave(repeats, dim=0)
                self._v = self._v.repeat_interleave(repeats, dim=0)
                self._views()

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            if self.length:
                self._k, self._v = self._k[indices], self._v[indices]
                self._views()

    return ReservedLayer


_RESERVED = None


def supports_reserved(model) -> bool:
    """Whether every layer is plain full attention (no sliding windows, no
    hybrid layers): the models `reserved_cache` serves."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False
    return all(t == "full_attention" for t in (getattr(config, "layer_types", None) or []))


def reserved_cache(model, capacity: int):
    """A cache for `model` whose layers hold `capacity` tokens without
    copying, or None where the model needs special layers (sliding windows,
    hybrid attention): then transformers builds its own."""
    global _RESERVED
    from transformers.cache_utils import Cache

    if not supports_reserved(model):
        return None
    if _RESERVED is None:
        _RESERVED = _reserved_layer_class()
    return Cache(layer_class_to_replicate=partial(_RESERVED, capacity))


# --------------------------------------------------------------- attention

def decode_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """Attention for one query token per row, grouped-query heads attending
    their shared key/value head without copying it; anything else goes to
    `grouped_sdpa`. Returns (B, q, H, D) like every attention function."""
    B, H, q, D = query.shape
    KVH = key.shape[1]
    if q != 1 or torch.is_grad_enabled() or H % KVH:
        return grouped_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                            is_causal=is_causal, **kwargs)
    G = H // KVH
    scale = scaling if scaling is not None else D ** -0.5
    scores = widened(torch.matmul(query.reshape(B, KVH, G, D), key.transpose(-1, -2))) * scale  # (B, KVH, G, T)
    if attention_mask is not None:
        m = attention_mask[:, :, -1:, : key.shape[2]]  # (B, 1, 1, T)
        if m.dtype == torch.bool:
            scores = scores.masked_fill(~m, float("-inf"))
        else:
            scores = scores + m.to(scores.dtype)
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(probs, value)  # (B, KVH, G, D)
    return out.reshape(B, H, 1, D).transpose(1, 2).contiguous(), None


def grouped_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' SDPA, except that on the CPU a masked grouped-query
    attention runs as SDPA's own grouped-query attention (`enable_gqa`).
    transformers copies every key/value head once per query head it serves
    whenever there is a mask (CUDA kernels would fall back to the math one):
    the whole cache, per layer, forward and backward. Measured on
    SmolLM2-135M's shapes (9 query heads on 3, 2 threads): 9 rows of 4 label
    tokens on a 568-token cache, forward + backward 19-68 -> 4-6 ms a layer;
    the same numbers (tests/test_fastpath.py)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    plain = (not GROUPED_SDPA or query.device.type != "cpu" or groups <= 1 or attention_mask is None
             or any(kwargs.get(k) is not None for k in ("position_bias", "cache")) or kwargs.get("output_attentions"))
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    # with a mask transformers' SDPA is never causal: the mask says it all
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                                           scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def register_attention() -> None:
    """Make `DECODE_ATTENTION` (rollouts) and `TRAIN_ATTENTION` (updates)
    transformers attention implementations, with SDPA's mask, once per process."""
    from transformers import AttentionInterface
    from transformers.masking_utils import (
        ALL_MASK_ATTENTION_FUNCTIONS,
        AttentionMaskInterface,
    )

    for name, function in ((DECODE_ATTENTION, decode_attention), (TRAIN_ATTENTION, grouped_sdpa)):
        if name not in AttentionInterface._global_mapping:
            AttentionInterface.register(name, function)
            AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


def training_attention(model):
    """The attention an update on `model` runs: `TRAIN_ATTENTION` where the
    model uses SDPA on the CPU, else its own (None)."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa" or next(model.parameters()).device.type != "cpu":
        return None
    register_attention()
    return TRAIN_ATTENTION


@contextlib.contextmanager
def attention(model, name: str | None):
    """Use attention implementation `name` inside (the config is shared by
    the trainer, so it is put back after)."""
    if name is None:
        yield
        return
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config") and hasattr(m.config, "_attn_implementation")}
    before = {k: c._attn_implementation for k, c in configs.items()}
    try:
        for c in configs.values():
            c._attn_implementation = name
        yield
    finally:
        for k, c in configs.items():
            c._attn_implementation = before[k]
