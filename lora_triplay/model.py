"""One frozen base model and three LoRA adapters on it.

The base is loaded once; `red`, `blue` and `evaluator` (the eval role: the
PEFT name `eval` would shadow `nn.Module.eval`) are LoRA adapters on the same
modules. The KL reference of every role is the base with adapters disabled,
so no reference model is ever loaded. Weights are read from safetensors only.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .bases import ModelError, resolve_base
from .core.atomic import plain_write
from .recipe import LoraConfig, ModelConfig

log = logging.getLogger(__name__)

def pick_device(cfg: ModelConfig) -> torch.device:
    if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ModelError("device cuda (model.device or --device) but no CUDA device is visible; set model.device=cpu, "
                             "or pass --device cpu to eval, play, chat and export")
        # one process per GPU under accelerate/torchrun: this rank's own GPU
        local = int(os.environ.get("LOCAL_RANK", "0")) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else 0
        if local >= torch.cuda.device_count():
            raise ModelError(f"process LOCAL_RANK={local} but only {torch.cuda.device_count()} GPU(s) are visible; launch one process per GPU")
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def pick_dtype(cfg: ModelConfig, device: torch.device) -> torch.dtype:
    if cfg.dtype != "auto":
        return getattr(torch, cfg.dtype)
    # On CPU float32: bf16 is 3-5x slower on AVX2 and its log-probs drift.
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_tokenizer(path: str, cfg: ModelConfig):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=cfg.trust_remote_code, revision=cfg.revision)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"  # batched generation appends on the right
    if not tok.chat_template:
        raise ModelError(f"the tokenizer of {path!r} has no chat template; use an instruct/chat model")
    return tok


def pick_attention(cfg: ModelConfig, device: torch.device) -> str:
    """`auto`: flash-attention 2 where it is installed on CUDA, else SDPA
    (PyTorch's fused attention, everywhere); any other value is passed to
    transformers as is."""
    if cfg.attn_implementation != "auto":
        if cfg.attn_implementation == "flash_attention_2" and (device.type != "cuda" or importlib.util.find_spec("flash_attn") is None):
            raise ModelError("model.attn_implementation = 'flash_attention_2' needs CUDA and `pip install flash-attn`; use `auto` or `sdpa`")
        return cfg.attn_implementation
    if device.type == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


def quantization_config(cfg: ModelConfig, device: torch.device, dtype: torch.dtype):
    """QLoRA's base: NF4 weights with double quantization, compute in the
    run's dtype. CUDA and bitsandbytes only."""
    if cfg.quantization == "none":
        return None
    if device.type != "cuda":
        raise ModelError("model.quantization = '4bit' (QLoRA through bitsandbytes) runs on CUDA only; set model.quantization=none")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ModelError("model.quantization = '4bit' needs bitsandbytes: `pip install -e .[gpu]` or `pip install bitsandbytes`")
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=dtype)


def load_base(cfg: ModelConfig, place: bool = True):
    """Return (model, tokenizer, resolved_path) with every base weight frozen;
    `place` False leaves it on the CPU (sharding.py moves each rank's part)."""
    from transformers import AutoModelForCausalLM

    path = resolve_base(cfg.base, cfg.revision)
    device = pick_device(cfg)
    dtype = pick_dtype(cfg, device)
    attention = pick_attention(cfg, device)
    kwargs: dict[str, Any] = dict(
        dtype=dtype,
        trust_remote_code=cfg.trust_remote_code,
        use_safetensors=True,  # never unpickle weights
        revision=cfg.revision,
        attn_implementation=attention,
    )
    quant = quantization_config(cfg, device, dtype)
    if quant is not None:
        kwargs.update(quantization_config=quant, device_map={"": device.index or 0})
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except OSError as exc:
        raise ModelError(f"cannot load model.base = {cfg.base!r}: {str(exc).splitlines()[0]}") from None
    if quant is None and place:
        model.to(device)
    log.info("base %s: %s on %s, attention %s%s", cfg.base, str(dtype).removeprefix("torch."), device.type, attention,
             ", 4-bit NF4 (QLoRA)" if quant is not None else "")
    freeze_base(model, cfg)
    return model, load_tokenizer(path, cfg), path


def freeze_base(model, cfg: ModelConfig) -> None:
    """Every base weight frozen; gradient checkpointing as the recipe asks."""
    for p in model.parameters():
        p.requires_grad_(False)
    if cfg.gradient_checkpointing:
        # Non-reentrant: the only kind that lets log-probs flow through
        # activations recomputed in backward without input grads.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()


def peft_lora_config(cfg: LoraConfig):
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        layers_to_transform=list(cfg.layers) if cfg.layers is not None else None,
        bias="none",
        task_type="CAUSAL_LM",
    )


def check_lora_targets(cfg: ModelConfig, lora: LoraConfig) -> None:
    """Before a new run loads its base: every name in lora.target_modules
    names some module of it (the base's skeleton from its config, on the meta
    device: no weights, a second even for 14B). Runs trained before this
    check (resume, eval, export) are not refused for it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = resolve_base(cfg.base, cfg.revision)
    config = AutoConfig.from_pretrained(path, trust_remote_code=cfg.trust_remote_code, revision=cfg.revision)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config, trust_remote_code=cfg.trust_remote_code)
    _check_targets(skeleton, lora.target_modules)


def _check_targets(base, targets: list[str]) -> None:
    """Every name in lora.target_modules must name some module of the base:
    PEFT fails only when none does, so one typo (`nope_proj`) left that
    projection without LoRA, silently."""
    names = [n for n, _ in base.named_modules() if n]
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        linears = sorted({n.rsplit(".", 1)[-1] for n, m in base.named_modules() if isinstance(m, torch.nn.Linear)} - {"lm_head"})
        raise ModelError(f"lora.target_modules: {', '.join(missing)} matches no module of this base; its linear layers are "
                         f"{', '.join(linears)}")


def attach_role_adapters(base, cfg: LoraConfig, seed: int, names: list[str]):
    """Wrap the base in a PeftModel holding one fresh adapter per role
    (`names`: the game's adapter names, e.g. TriPlay's red, blue, evaluator).

    B is zero at init (PEFT's default), so every role starts as the base;
    A differs per role because each gets its own seeded draw.
    """
    from peft import get_peft_model

    names = list(names)
    depth = getattr(getattr(base, "config", None), "num_hidden_layers", None)
    if depth is not None and (wrong := cfg.layers_beyond(depth)):
        raise ModelError(wrong)
    torch.manual_seed(seed)
    try:
        model = get_peft_model(base, peft_lora_config(cfg), adapter_name=names[0])
    except ValueError as exc:
        raise ModelError(f"lora.target_modules = {cfg.target_modules}: {exc}") from None
    for i, name in enumerate(names[1:], start=1):
        torch.manual_seed(seed + i)
        model.add_adapter(name, peft_lora_config(cfg))
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def load_role_model(cfg: ModelConfig, lora: LoraConfig, seed: int, names: list[str], world: int = 1):
    """(PeftModel with the roles' adapters, tokenizer, base path); with
    `model.fsdp` and several processes the decoder layers are sharded
    across them (sharding.py), loaded on the CPU first so that no GPU ever
    holds the whole base."""
    from .training import sharding

    def build(mesh=None):
        base, tokenizer, path = load_base(cfg, place=mesh is None)
        model = attach_role_adapters(base, lora, seed, names)
        if mesh is not None:
            sharding.shard_base(model, mesh, pick_device(cfg))
        return model, tokenizer, path

    if not (cfg.fsdp and world > 1):
        if cfg.fsdp:
            log.info("model.fsdp: one process, nothing to shard")
        return build()
    sharding.check_supported()  # before minutes of loading
    device = pick_device(cfg)
    mesh = sharding.device_mesh(world, device)
    return sharding.in_turns(lambda: build(mesh), _whole_base_bytes(cfg, device))


def _whole_base_bytes(cfg: ModelConfig, device: torch.device) -> float | None:
    """One whole copy of the base in the run's dtype (from its config, like
    `plan`), for loading in turns; None when the config cannot be read."""
    from .plan import PlanError, load_shape

    try:
        params = load_shape(cfg.base, cfg.revision, cfg.trust_remote_code).params()
    except PlanError:
        return None
    return params * torch.empty((), dtype=pick_dtype(cfg, device)).element_size()


def adapter_parameters(model, adapter: str) -> dict[str, torch.nn.Parameter]:
    """The trainable tensors of one adapter, by parameter name."""
    key = f".{adapter}."
    return {n: p for n, p in model.named_parameters() if key in n and "lora_" in n}


def activate(model, adapter: str) -> list[torch.nn.Parameter]:
    """Make `adapter` the one that trains; every other tensor is frozen."""
    model.base_model.set_adapter(adapter)
    for p in model.parameters():
        p.requires_grad_(False)
    params = list(adapter_parameters(model, adapter).values())
    for p in params:
        p.requires_grad_(True)
    return params


@dataclass
class AdapterFiles:
    weights: Path
    config: Path


def save_adapter(model, adapter: str, folder: Path, base_name: str, write=plain_write) -> AdapterFiles:
    """Write one adapter in PEFT's own format (`adapter_config.json` +
    `adapter_model.safetensors`), loadable by `PeftModel.from_pretrained` and
    by vLLM's `--lora-modules`. `write(path, bytes)` is the atomic writer."""
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save

    state = _plain_lora_state(model, adapter)
    if state is None:
        state = get_peft_model_state_dict(model, adapter_name=adapter)
    state = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    config = model.peft_config[adapter].to_dict()
    config["base_model_name_or_path"] = base_name
    config["inference_mode"] = True
    for key, value in list(config.items()):
        if isinstance(value, set):
            config[key] = sorted(value)
    folder.mkdir(parents=True, exist_ok=True)
    files = AdapterFiles(folder / "adapter_model.safetensors", folder / "adapter_config.json")
    write(files.weights, save(state, metadata={"format": "pt"}))
    write(files.config, json.dumps(config, indent=2, default=str).encode())
    return files


def _plain_lora_state(model, adapter: str) -> dict[str, torch.Tensor] | None:
    """PEFT's saved state of a plain LoRA adapter (A/B matrices only), read
    from the named parameters directly. `get_peft_model_state_dict` builds
    the whole model's state_dict (every adapter and base tensor) to pick
    these out: 75% of an adapter sync on the embedded model. None for
    anything else (DoRA, biases, modules_to_save, embeddings): PEFT decides."""
    cfg = model.peft_config[adapter]
    if getattr(cfg, "use_dora", False) or getattr(cfg, "bias", "none") != "none" or getattr(cfg, "modules_to_save", None):
        return None
    marker = f".{adapter}."
    state = {}
    for name, p in model.named_parameters():
        if marker not in name:
            continue
        if ".lora_A." not in name and ".lora_B." not in name:
            return None
        state[name.replace(marker, ".")] = p
    return state


def read_adapter_state(folder: Path, expect_rank: int | None = None) -> dict[str, torch.Tensor]:
    """Read an adapter folder's weights; refuse pickles and wrong ranks."""
    from safetensors.torch import load_file

    weights = folder / "adapter_model.safetensors"
    if not weights.is_file():
        if (folder / "adapter_model.bin").is_file():
            raise ModelError(f"{folder}: adapter_model.bin is a pickle and is refused; convert it to adapter_model.safetensors")
        raise ModelError(f"{folder}: no adapter_model.safetensors; is this a PEFT adapter folder?")
    cfg_file = folder / "adapter_config.json"
    if expect_rank is not None and cfg_file.is_file():
        rank = json.loads(cfg_file.read_text()).get("r")
        if rank is not None and rank != expect_rank:
            raise ModelError(f"{folder}: adapter rank {rank} differs from lora.rank = {expect_rank}; set lora.rank={rank} or use another adapter")
    return load_file(str(weights))


def load_adapter_weights(model, adapter: str, folder: Path, expect_rank: int | None = None) -> None:
    """Load saved weights into an existing adapter slot, in place."""
    from peft.utils import set_peft_model_state_dict

    state = read_adapter_state(folder, expect_rank)
    try:
        result = set_peft_model_state_dict(model, state, adapter_name=adapter)
    except RuntimeError as exc:  # shape mismatch: another base or rank
        first = str(exc).strip().splitlines()[-1][:200]
        raise ModelError(f"{folder}: the adapter does not fit this base model ({first}); was it trained on another base?") from None
    unexpected = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
    if unexpected:
        raise ModelError(f"{folder}: {len(unexpected)} adapter tensors do not fit this base (e.g. {unexpected[0]}); was it trained on "
                         "another base model, or with other lora.layers / lora.target_modules?")
    # the slot's own tensors the file lacks would stay as initialised, silently
    missing = [k for k in getattr(result, "missing_keys", []) if "lora_" in k and f".{adapter}." in k]
    if missing:
        raise ModelError(f"{folder}: the adapter lacks {len(missing)} of the {adapter!r} slot's tensors (e.g. {missing[0]}); "
                         "was it trained with other lora.layers / lora.target_modules?")


def add_frozen_adapter(model, name: str, folder: Path, lora: LoraConfig) -> None:
    """Load a past snapshot (e.g. `blue@3`) as an extra, frozen adapter.
    PEFT draws the new slot's initial weights from torch's global generator
    (overwritten at once by the snapshot's): the draw runs on a forked
    generator, or a resumed run, which loads its snapshots again, would
    sample other rollouts than the run it resumes."""
    if name in model.peft_config:
        model.delete_adapter(name)
    # the CUDA generator only where CUDA is already up (asking for its device would start it on a CPU run)
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.cuda.is_initialized() else []):
        model.add_adapter(name, peft_lora_config(lora))
    load_adapter_weights(model, name, folder, expect_rank=lora.rank)
    for p in adapter_parameters(model, name).values():
        p.requires_grad_(False)
