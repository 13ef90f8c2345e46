"""Merge one role's adapter into the base and write a standard HF model folder.

The folder holds what `AutoModelForCausalLM.from_pretrained(DIR)` and
`vllm serve DIR` read, and nothing lora-triplay specific beyond a small
`lora_triplay_export.json` note: safetensors weights (no adapter keys left),
config, generation config, tokenizer files and chat template.

The merge is W' = W + scaling * B @ A, computed in float32 and rounded once
to the base's stored dtype (PEFT's `merge_and_unload` rounds the delta to
bf16 before adding it to a bf16 base: two roundings). Adapters with features
our trainer never writes (DoRA, LoRA bias, modules_to_save...) fall back to
PEFT's own `merge_and_unload`. A fresh base is loaded per role, so the base
in memory is never left half-merged.

Folders are written to a temp sibling and renamed into place, so a crash
never leaves a folder that looks complete; `--role all` renames the parent
of red/ blue/ eval/ at once.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from .bases import ModelError, resolve_base
from .core.atomic import write_folder
from .core.runs import read_run_recipe, snapshot_folder
from .core.snapshots import parse_role
from .core.store import RunStore

log = logging.getLogger(__name__)

EXPORT_NOTE = "lora_triplay_export.json"
PEFT_NAME = "default"


@dataclass
class ExportResult:
    role: str
    folder: Path
    seconds: float
    info: dict


def stored_dtype(base_path: str, revision: str | None = None, trust_remote_code: bool = False):
    """The dtype the base's config declares (float32 when it declares none)."""
    import torch
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(base_path, revision=revision, trust_remote_code=trust_remote_code)
    dtype = getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None) or "float32"
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return dtype


def _exotic(config: dict) -> list[str]:
    """Adapter features the manual merge does not handle."""
    flags = []
    if config.get("use_dora"):
        flags.append("use_dora")
    if config.get("lora_bias"):
        flags.append("lora_bias")
    for key in ("modules_to_save", "trainable_token_indices", "target_parameters"):
        if config.get(key):
            flags.append(key)
    return flags


def merge_adapter(base_path: str, adapter_folder: Path, *, device: str = "cpu", revision: str | None = None,
                  trust_remote_code: bool = False):
    """Return (merged plain transformers model, dtype). The adapter folder is
    a PEFT folder (`adapter_config.json` + `adapter_model.safetensors`)."""
    import torch
    from peft import PeftModel
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer
    from transformers import AutoModelForCausalLM

    dtype = stored_dtype(base_path, revision, trust_remote_code)
    base = AutoModelForCausalLM.from_pretrained(
        base_path, dtype=dtype, use_safetensors=True, revision=revision, trust_remote_code=trust_remote_code,
    ).to(device)
    config = json.loads((adapter_folder / "adapter_config.json").read_text(encoding="utf-8"))
    model = PeftModel.from_pretrained(base, str(adapter_folder), adapter_name=PEFT_NAME, is_trainable=False)
    exotic = _exotic(config)
    if exotic:
        log.warning("%s uses %s: merging with PEFT's merge_and_unload", adapter_folder, exotic)
        merged = model.merge_and_unload()
    else:
        embeddings = {id(p) for p in base.get_input_embeddings().parameters()}
        with torch.no_grad():
            for name, module in model.named_modules():
                if not isinstance(module, LoraLayer) or PEFT_NAME not in getattr(module, "lora_A", {}):
                    continue
                if not isinstance(module, LoraLinear):
                    raise ModelError(f"{adapter_folder}: cannot merge the {type(module).__name__} adapter layer at {name}; "
                                     "only Linear LoRA layers are supported")
                weight = module.get_base_layer().weight
                if id(weight) in embeddings:
                    raise ModelError(f"{adapter_folder}: the adapter on {name} targets weights tied to the input embeddings; "
                                     "merging it would change both")
                a = module.lora_A[PEFT_NAME].weight.float()
                b = module.lora_B[PEFT_NAME].weight.float()
                delta = (b @ a) * module.scaling[PEFT_NAME]
                if module.fan_in_fan_out:
                    delta = delta.T
                weight.copy_((weight.float() + delta).to(weight.dtype))
        merged = model.unload()  # drop the LoRA wrappers; the base weights now hold the merge
    left = [k for k in merged.state_dict() if "lora_" in k or ".base_layer." in k]
    if left:
        raise ModelError(f"merging {adapter_folder} left adapter tensors behind (e.g. {left[0]}); report this as a bug")
    merged.eval()
    return merged, dtype


def _is_export(folder: Path) -> bool:
    """An earlier export: one role's folder with our note, or `all`'s folder
    of such folders."""
    if (folder / EXPORT_NOTE).is_file():
        return True
    entries = list(folder.iterdir())
    return bool(entries) and all(e.is_dir() and (e / EXPORT_NOTE).is_file() for e in entries)


def _check_target(out: Path, force: bool, run_dir: Path) -> None:
    """`--force` replaces an earlier export, and nothing else: never a file,
    the run folder, a folder holding it, or a folder of other things; and
    never into what a run manages (a resume prunes its checkpoints)."""
    from .outputs import check_export_out

    check_export_out(out)
    if not out.exists() and not out.is_symlink():
        return
    if out.is_file() or not out.is_dir():
        raise ModelError(f"--out {out} is a file; choose a folder path for the exported model")
    run, target = run_dir.resolve(), out.resolve()
    if target == run or target in run.parents:
        raise ModelError(f"--out {out} holds the run folder {run_dir}; choose a folder outside it, e.g. {run_dir}-export")
    if not any(out.iterdir()):
        return
    if not force:
        raise ModelError(f"{out} exists and is not empty; pass --force to replace an earlier export, or choose another --out")
    if not _is_export(out):
        raise ModelError(f"{out} is not an earlier export (no {EXPORT_NOTE}): --force replaces only exports; "
                         "choose another --out, or remove the folder yourself")


def _readable(root: Path) -> None:
    """mkdtemp and some writers create user-only files; a model folder is
    meant to be shared, so give it the umask's usual permissions."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [root, *root.rglob("*")]:
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


def _run_state(store: RunStore) -> dict | None:
    if not store.has_state():
        return None
    st = store.load_state()
    return {k: st.get(k) for k in ("iteration", "phase", "step", "done")}


def _write_role(run_dir: Path, role: str, iteration: int | None, folder: Path, *, device: str) -> ExportResult:
    from .triplay.roles import blue_messages

    t0 = time.perf_counter()
    recipe = read_run_recipe(run_dir)
    store = RunStore(run_dir)
    adapter = snapshot_folder(store, role, iteration)
    base_path = resolve_base(recipe.model.base, recipe.model.revision)
    merged, dtype = merge_adapter(base_path, adapter, device=device, revision=recipe.model.revision,
                                  trust_remote_code=recipe.model.trust_remote_code)
    from transformers import AutoTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(folder, safe_serialization=True)
    tok = AutoTokenizer.from_pretrained(base_path, revision=recipe.model.revision, trust_remote_code=recipe.model.trust_remote_code)
    if role.split("@")[0] == "blue":
        tok.chat_template = default_system(tok.chat_template, blue_messages("")[0]["content"])
    tok.save_pretrained(folder)
    if not (folder / "generation_config.json").is_file():
        merged.generation_config.save_pretrained(folder)
    info = {
        "format": "lora-triplay export 1",
        "run": str(Path(run_dir).resolve()),
        "role": role,
        "iteration": iteration,
        "weights": adapter.name if iteration is not None else "latest",
        "run_state": _run_state(store) if iteration is None else None,
        "adapter": str(adapter.resolve()),
        "base": recipe.model.base,
        "base_path": base_path,
        "dtype": str(dtype).removeprefix("torch."),
        "lora": {"rank": recipe.lora.rank, "alpha": recipe.lora.alpha, "target_modules": list(recipe.lora.target_modules),
                 "layers": recipe.lora.layers},
        "enable_thinking": recipe.model.enable_thinking,
        "lora_triplay_version": _version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if role == "blue":
        info["system_prompt"] = blue_messages("")[0]["content"]  # what blue was trained with
    if role == "eval":
        info["prompt_format"] = ("eval reads lora_triplay.triplay.roles.eval_messages(prompt, response"
                                 + (", kind)" if recipe.rewards.eval_sees_kind else ")")
                                 + " and answers `Label: negative|rejective|positive`")
        # what eval read as the prompt in training: red's rewrite or the request it wraps
        info["judge_prompt"] = recipe.rewards.judge_prompt
        info["eval_sees_kind"] = recipe.rewards.eval_sees_kind  # whether it was told harmful / benign
    (folder / EXPORT_NOTE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    del merged
    return ExportResult(role, folder, time.perf_counter() - t0, info)


def default_system(template, system: str):
    """`template` (the base's chat template) with `system` as the system
    prompt of a chat that brings none: an exported blue, loaded by any
    client, then answers as it was trained to (the base's own default, e.g.
    SmolLM2's "You are a helpful AI assistant named SmolLM", is what it
    would read otherwise). A chat with its own system message keeps it."""
    if not isinstance(template, str) or "{% endraw %}" in system:
        return template  # several named templates, or none: lora_triplay_export.json still names the prompt
    return ("{%- if messages and messages[0]['role'] != 'system' -%}\n"
            "{%- set lt_system -%}{% raw %}" + system + "{% endraw %}{%- endset -%}\n"
            "{%- set messages = [{'role': 'system', 'content': lt_system}] + messages -%}\n"
            "{%- endif -%}\n" + template)


def _version() -> str | None:
    try:
        from importlib.metadata import version

        return version("lora-triplay")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return None


def export(run_dir: Path, role: str, out: Path, *, iteration: int | None = None, force: bool = False,
           device: str = "cpu") -> list[ExportResult]:
    """Export `role` (`red|blue|eval`, `blue@3`, or `all`) of a run to `out`.

    `all` writes out/red, out/blue, out/eval. The whole of `out` appears at
    once (temp folder + rename); an existing non-empty `out` needs `force`.
    """
    run_dir, out = Path(run_dir), Path(out)
    if not run_dir.is_dir():
        raise ModelError(f"run folder {run_dir} does not exist; pass the folder `lora-triplay run` wrote")
    recipe = read_run_recipe(run_dir)  # a clear error before any work
    if device not in ("cpu", "cuda"):
        raise ModelError(f"--device {device!r}: use cpu or cuda")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ModelError("--device cuda: no CUDA device is visible; merge on the CPU (--device cpu)")
    if role == "all":
        from .games import game_class

        roles = [(r, iteration) for r in game_class(recipe.game).roles]
    else:
        name, it = parse_role(role, allow_base=False)
        if it is not None and iteration is not None and it != iteration:
            raise ModelError(f"--role {role} and --iteration {iteration} disagree; give one of them")
        roles = [(name, it if it is not None else iteration)]
    store = RunStore(run_dir)
    for name, it in roles:  # fail on a missing snapshot before loading anything
        snapshot_folder(store, name, it)
    _check_target(out, force, run_dir)
    results = []

    def fill(tmp: Path) -> None:
        for name, it in roles:
            folder = tmp / name if role == "all" else tmp
            results.append(_write_role(run_dir, name, it, folder, device=device))
        _readable(tmp)

    if out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
        out.rmdir()
    write_folder(out, fill)  # an existing `out` (with --force) stays whole until the new one is in place
    for r in results:
        r.folder = out / r.role if role == "all" else out
    return results
