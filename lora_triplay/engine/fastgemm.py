"""The fast path's GEMMs: the base's Linears as few and as fast as they can
be, the numbers unchanged (fp32 rounding apart; tests/test_fastpath.py).

Measured on SmolLM2-135M, 32 rows, one thread of this project's CPU
(AMD EPYC, AVX-512; bench/bench_roofline.py), where 65% of a rollout was
`F.linear`:

- **oneDNN instead of MKL** (`linear`): torch sends fp32 `F.linear` on CPU
  to MKL, which ran the decode shapes at 52-68 GFLOPS and the lm_head at
  42-52; oneDNN (bundled with torch; the kernel inductor uses) ran the same
  shapes on the same unpacked weights at 104-132 (M=32) and 160-170
  (M=704), side by side in one process. Same fp32 arithmetic in another
  summation order (within 1e-4 of MKL on 576-long dots); checked against
  F.linear once per process, F.linear wherever it does not apply (GPU,
  other dtypes, autograd).
- **one GEMM per shared input** (`FusedGroup`): q/k/v read the same hidden
  state, and so do gate/up. Their frozen base weights are laid into one
  tensor once, when the fast path is built, and the modules' own weights
  become row views of it (no second copy). While serving, the group's first
  member runs one GEMM for all (oneDNN: 65 -> 52 ms for the 30 layers'
  projections at M=32; MKL gains nothing from it) plus one stacked LoRA A
  GEMM, and its siblings take their slices. Every other LoRA layer is a
  group of one: no forward hook, no PEFT wrapper on the way.
- **lm_head in column blocks** (`blocked_lm_head`): 32 x 576 @ 576 x 49,152
  (a 6 MB output) ran at 48-50 GFLOPS with MKL against 88 for the layer
  shapes, in 2,048-column blocks at 60; and at the prefill's last position
  (a strided slice) transformers' lm_head became a bmm over an expanded
  weight (0.46 s for one 32-row prefill). Here the rows are made contiguous
  and the blocks written into one preallocated logits tensor.

In the rollout itself (bench_roofline.py --compare, 32 mixed rows x 48
tokens, alternated in one run): 140 -> 226 tok/s from oneDNN, fusing and
the blocks together within noise on top (231). The fused copy is
memory-neutral: a CPU base's weights are pages of its mapped safetensors
file, which the mapping keeps resident after the module lets go of them,
so `fuse` hands those pages back (`release_file_pages`; +13 MB RSS left
against +279 MB without it, SmolLM2-135M).
"""
from __future__ import annotations

from functools import partial

import torch

# Sibling projections that read the same input, by attribute name.
FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def _plain_linear(module) -> bool:
    return type(module) is torch.nn.Linear


# ------------------------------------------------------------------ oneDNN

_ONEDNN_OK: bool | None = None


def _onednn(x, weight, bias):
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _onednn_applies(x, weight) -> bool:
    return (x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and not torch.is_grad_enabled() and weight.dim() == 2)


def onednn_ok() -> bool:
    """Whether this torch has oneDNN's linear and it gives F.linear's
    numbers (fp32 rounding apart): checked once per process."""
    global _ONEDNN_OK
    if _ONEDNN_OK is None:
        try:
            g = torch.Generator().manual_seed(0)
            x, w, b = (torch.randn(s, generator=g) for s in ((5, 3, 96), (40, 96), (40,)))
            with torch.no_grad():
                ours, ref = _onednn(x, w, b), torch.nn.functional.linear(x, w, b)
            _ONEDNN_OK = bool(torch.backends.mkldnn.is_available()) and torch.allclose(ours, ref, rtol=1e-5, atol=1e-4)
        except (AttributeError, RuntimeError, NotImplementedError):  # no mkldnn op in this build
            _ONEDNN_OK = False
    return _ONEDNN_OK


def linear(x, weight, bias=None):
    """F.linear, through oneDNN where that applies (see the module doc)."""
    if _onednn_applies(x, weight):
        return _onednn(x, weight, bias)
    return torch.nn.functional.linear(x, weight, bias)


def _patched_linear(module, x):
    return linear(x, module.weight, module.bias)


def plain_linears(model) -> list:
    """Every plain Linear of the base: LoRA's base layers, projections
    without an adapter, the lm_head; not LoRA's own A/B."""
    from peft.tuners.lora import LoraLayer

    lora_parts = {id(sub) for m in model.modules() if isinstance(m, LoraLayer) for d in (m.lora_A, m.lora_B)
                  for sub in d.values()}
    return [m for m in model.modules() if _plain_linear(m) and id(m) not in lora_parts]


def onednn_linears(modules: list) -> list:
    """Point each of `modules` (plain_linears) at `linear`; returns them
    (the caller removes their `forward`)."""
    for m in modules:
        m.forward = partial(_patched_linear, m)
    return list(modules)


# ----------------------------------------- pages of a mapped file, returned

def _sole_owner(param) -> bool:
    """Whether `param` is the only tensor on its storage (2: the parameter
    and the wrapper this call makes) and the storage is all of it."""
    try:
        storage = param.untyped_storage()
        return torch._C._storage_Use_Count(storage._cdata) <= 2 and storage.nbytes() == param.nbytes
    except (AttributeError, RuntimeError):
        return False


def _file_mappings() -> list[tuple[int, int]]:
    """(start, end) of this process's private mappings of regular files."""
    spans = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and parts[1].endswith("p") and parts[5].startswith("/") and not line.rstrip().endswith("(deleted)"):
                a, b = (int(x, 16) for x in parts[0].split("-"))
                spans.append((a, b))
    return spans


def release_file_pages(ranges: list[tuple[int, int]]) -> int:
    """madvise(DONTNEED) the whole pages inside each (address, nbytes) range
    that lies in a private file mapping: they leave RSS, and a read (none is
    left: the caller dropped the tensors) would fault the file's bytes back
    in. Heap memory is never touched (it may hold other objects by now).
    Linux only; returns the bytes released."""
    import ctypes
    import os
    import sys

    if not ranges or not sys.platform.startswith("linux"):
        return 0
    try:
        maps = _file_mappings()
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return 0
    page, released = os.sysconf("SC_PAGE_SIZE"), 0
    for start, nbytes in ranges:
        end = start + nbytes
        if not any(a <= start and end <= b for a, b in maps):
            continue
        lo, hi = -(-start // page) * page, end // page * page
        if hi > lo and madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), 4) == 0:  # 4: MADV_DONTNEED
            released += hi - lo
    return released


# ------------------------------------------------ fused sibling projections

def find_groups(model) -> list["FusedGroup"]:
    """Every LoRA layer on a plain Linear, in groups: siblings named in
    FUSED_GROUPS that share an input size, dtype, device and bias-ness are
    one group (their base weights fused), every other layer a group of one."""
    from peft.tuners.lora import LoraLayer

    def plain_lora(m) -> bool:
        return isinstance(m, LoraLayer) and _plain_linear(getattr(m, "base_layer", None))

    groups, taken = [], set()
    for parent in model.modules():
        for names in FUSED_GROUPS:
            members = [getattr(parent, n, None) for n in names]
            if not all(plain_lora(m) for m in members):
                continue
            bases = [m.base_layer for m in members]
            w0 = bases[0].weight
            if any(b.in_features != bases[0].in_features or b.weight.dtype != w0.dtype or b.weight.device != w0.device
                   or (b.bias is None) != (bases[0].bias is None) for b in bases):
                continue
            groups.append(FusedGroup(members))
            taken.update(id(m) for m in members)
    groups += [FusedGroup([m]) for m in model.modules() if plain_lora(m) and id(m) not in taken]
    return groups


class FusedGroup:
    """LoRA projections that read one input, computed as one GEMM.

    The base weights are concatenated once (`fuse`) and every member's
    weight becomes a row view of the result: resident memory stays one
    copy, and training, saving adapters or merging in place see the same
    numbers. Anything that replaces a member's storage (`model.to`, a
    non-in-place merge) breaks the view; `serve` checks and fuses again.
    (A `save_pretrained` of the base itself would see shared storage: the
    run never saves the base, `export` loads a fresh one.)"""

    def __init__(self, members: list):
        self.members = members
        self.bases = [m.base_layer for m in members]
        self.sizes = [b.out_features for b in self.bases]
        self.fuse()

    def _parts(self):
        return (("weight", self.weight), ("bias", self.bias))

    def fuse(self) -> None:
        if len(self.bases) == 1:  # nothing to fuse: the layer's own tensors
            self.weight, self.bias = self.bases[0].weight, self.bases[0].bias
            return
        # The old weights' pages, where nothing but the module holds them
        # and they come from a file mapping (transformers maps a CPU base's
        # safetensors file): the mapping outlives them, so without giving
        # their pages back the fused copy would double them in RSS.
        spare = [(b.weight.data_ptr(), b.weight.nbytes) for b in self.bases if _sole_owner(b.weight)]
        with torch.no_grad():
            self.weight = torch.cat([b.weight.detach() for b in self.bases], 0)
            self.bias = torch.cat([b.bias.detach() for b in self.bases]) if self.bases[0].bias is not None else None
        for name, whole in self._parts():
            if whole is not None:
                for b, view in zip(self.bases, whole.split(self.sizes, 0)):
                    getattr(b, name).data = view
        release_file_pages(spare)

    def intact(self) -> bool:
        """Whether every member's weight (and bias) still views the fused tensor."""
        if len(self.bases) == 1:
            return True
        for name, whole in self._parts():
            if whole is None:
                continue
            for b, view in zip(self.bases, whole.split(self.sizes, 0)):
                p = getattr(b, name)
                if p.data_ptr() != view.data_ptr() or p.shape != view.shape or p.stride() != view.stride():
                    return False
        return True

    def serve(self, multi, use_onednn: bool) -> list:
        """Patch the members' forwards for one `MultiLora.serving` call
        (`multi` holds this call's stacked adapters and row masks); returns
        the patched modules (the caller removes their `forward`)."""
        if not self.intact():
            self.fuse()
        weight, bias = self.weight, self.bias
        gemm = linear if use_onednn else torch.nn.functional.linear
        stacks = [multi._stacks.get(m) for m in self.members]
        with_lora = [(j, st) for j, st in enumerate(stacks) if st is not None]
        # A: the members' stacked A matrices one after another (one GEMM);
        # then each member's own B on its columns and its slice of the output.
        A = torch.cat([st[0] for _, st in with_lora], 0) if with_lora else None
        offsets = [sum(self.sizes[:j]) for j in range(len(self.sizes) + 1)]
        blocks, r0 = [], 0
        for j, st in with_lora:
            r = st[0].shape[0]
            blocks.append((offsets[j], offsets[j + 1], r0, r0 + r, st[1].t()))
            r0 += r
        key = ("group", id(self))

        def mask(x):
            """The members' row masks side by side, once per `rows` call."""
            if len(with_lora) == 1:
                return multi._mask(self.members[with_lora[0][0]], x.device, A.dtype)
            if key not in multi._masks:
                multi._masks[key] = torch.cat([multi._mask(self.members[j], x.device, A.dtype) for j, _ in with_lora], 1)
            return multi._masks[key]

        state: dict = {}

        def first(x, *args, **kwargs):
            y = gemm(x, weight, bias)
            if A is not None:
                h = x.to(A.dtype) @ A.t()
                m = mask(x)
                h = (h * (m if h.dim() == 2 else m.unsqueeze(1))).reshape(-1, h.shape[-1])
                flat = y.view(-1, y.shape[-1])
                for o0, o1, a0, a1, Bt in blocks:
                    if flat.dtype == h.dtype:
                        flat[:, o0:o1].addmm_(h[:, a0:a1], Bt)
                    else:
                        flat[:, o0:o1] += (h[:, a0:a1] @ Bt).to(flat.dtype)
            if len(self.members) == 1:
                return y
            outs = y.split(self.sizes, -1)
            state["x"], state["outs"] = x, outs[1:]
            return outs[0]

        def sibling(j, layer, x, *args, **kwargs):
            if state.get("x") is x:  # the group's GEMM already ran on this very input
                out = state["outs"][j - 1]
                if j == len(self.members) - 1:
                    state.clear()
                return out
            # called out of order or on another input: this member alone
            y = gemm(x, layer.base_layer.weight, layer.base_layer.bias)
            return multi._hook(layer, (x,), y) if layer in multi._stacks else y

        self.members[0].forward = first
        for j, layer in enumerate(self.members[1:], 1):
            layer.forward = partial(sibling, j, layer)
        return list(self.members)


# ------------------------------------------------------------------ lm_head

def blocked_lm_head(model, block: int, use_onednn: bool) -> list:
    """Patch the output projection to run in `block`-column GEMMs written
    into one preallocated logits tensor, on contiguous rows; returns the
    patched modules (none where the head is not a plain Linear or not
    wider than a block)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if not _plain_linear(head) or head.out_features <= block:
        return []
    W, bias = head.weight, head.bias

    def forward(x):
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        if flat.dtype != W.dtype:
            return torch.nn.functional.linear(x, W, bias)
        out = flat.new_empty(flat.shape[0], W.shape[0])
        onednn = use_onednn and _onednn_applies(flat, W)
        for s in range(0, W.shape[0], block):
            b = None if bias is None else bias[s : s + block]
            if onednn:  # no out= in oneDNN's op: one copy of a block
                out[:, s : s + block] = _onednn(flat, W[s : s + block], b)
            else:  # MKL writes the block in place
                torch.mm(flat, W[s : s + block].t(), out=out[:, s : s + block])
                if b is not None:
                    out[:, s : s + block] += b
        return out.view(*x.shape[:-1], W.shape[0])

    head.forward = forward
    return [head]
