"""How the vLLM engine serves adapters: every role and snapshot is a LoRA
of one base, `base` an explicit zero adapter.

`sync_adapter(role)` writes the trainer's current adapter (adapter only,
never a merged base) into a fresh folder and registers it under a new LoRA
name and int id; the previous version is removed. A new id is required:
re-registering an id with a new path silently keeps serving the old
weights. vLLM's prefix-cache key includes the LoRA name and path, so blocks
computed with an old version are never reused by a new one. Sleep mode
(GPU) frees the engine's memory for the policy update; a wake that dropped
the loaded adapters registers them again.
"""
from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import UserError
from .base import BASE

log = logging.getLogger(__name__)


def write_zero_adapter(template: Path, folder: Path) -> Path:
    """Copy a PEFT adapter folder with every lora_B set to zero: serves the
    base model through the LoRA path (exactly x @ A @ 0 = 0)."""
    from safetensors.torch import load_file

    from ..core.atomic import save_tensors

    folder.mkdir(parents=True, exist_ok=True)
    state = load_file(str(Path(template) / "adapter_model.safetensors"))
    zero = {k: (torch.zeros_like(v) if "lora_B" in k else v).contiguous() for k, v in state.items()}
    save_tensors(zero, folder / "adapter_model.safetensors", metadata={"format": "pt"})
    shutil.copy2(Path(template) / "adapter_config.json", folder / "adapter_config.json")
    return folder


@dataclass
class _Served:
    """One registered adapter version."""

    request: object  # vllm LoRARequest
    folder: Path
    version: int




class AdapterServing:
    """Adapter bookkeeping of VLLMEngine (which sets llm, trainer, base_path,
    _served, _ids, _tmp, _sleeping, _pending_removals, _LoRARequest)."""

    def adapters(self) -> list[str]:
        return [BASE] + [n for n in self._served if n != BASE]

    def _register(self, name: str, folder: Path) -> None:
        """Serve `folder` under `name` as a new version (new id, new LoRA
        name); the previous version is removed."""
        version = next(self._ids)
        req = self._LoRARequest(f"{name}#{version}", version, str(folder))
        old = self._served.get(name)
        self._served[name] = _Served(req, Path(folder), version)
        if self._sleeping:
            # Loaded lazily by the first request after wake_up.
            if old is not None:
                self._pending_removals.append(old.version)
                self._retire_folder(old.folder)
            return
        self.llm.llm_engine.add_lora(req)
        if old is not None:
            self.llm.llm_engine.remove_lora(old.version)
            self._retire_folder(old.folder)

    def _retire_folder(self, folder: Path) -> None:
        if self._tmp in folder.parents:
            shutil.rmtree(folder, ignore_errors=True)

    def _save_trainer_adapter(self, internal: str, folder: Path) -> Path:
        from ..model import save_adapter

        save_adapter(self.trainer, internal, folder, self.base_path)
        return folder

    def sync_adapter(self, name: str) -> None:
        """Serve the trainer's current weights of role `name` (a new version)."""
        if self.trainer is None:
            raise RuntimeError("sync_adapter needs the trainer model: build the engine with trainer=... or from_session")
        if name not in self.trainer.peft_config:
            raise KeyError(f"adapter {name!r} is not in the trainer; known: {sorted(self.trainer.peft_config)}")
        folder = self._save_trainer_adapter(name, self._tmp / f"{name}.v{next(self._ids)}")
        self._register(name, folder)

    def load_adapter(self, name: str, folder: str) -> None:
        """Serve a frozen adapter folder (e.g. a `blue@3` snapshot). The files
        are copied, so later writes to `folder` cannot change what is served."""
        src = Path(folder)
        cfg = src / "adapter_config.json"
        if not (src / "adapter_model.safetensors").is_file() or not cfg.is_file():
            raise UserError(f"{src}: not a PEFT adapter folder (adapter_config.json + adapter_model.safetensors)")
        rank = json.loads(cfg.read_text()).get("r")
        limit = self.llm.llm_engine.vllm_config.lora_config.max_lora_rank
        if rank is not None and rank > limit:
            raise UserError(f"{src}: adapter rank {rank} exceeds this engine's max_lora_rank {limit}")
        dest = self._tmp / f"{name}.v{next(self._ids)}"
        dest.mkdir(parents=True)
        for f in ("adapter_model.safetensors", "adapter_config.json"):
            shutil.copy2(src / f, dest / f)
        self._register(name, dest)

    def remove_adapter(self, name: str) -> None:
        """Stop serving a frozen snapshot adapter (roles stay)."""
        served = self._served.get(name)
        if served is None or "@" not in name:
            return
        del self._served[name]
        if self._sleeping:
            self._pending_removals.append(served.version)
        else:
            self.llm.llm_engine.remove_lora(served.version)
        self._retire_folder(served.folder)

    def _lora(self, name: str):
        served = self._served.get(name)
        if served is None:
            raise KeyError(f"adapter {name!r} is not loaded; known: {', '.join(self.adapters())}")
        return served.request

    # ----------------------------------------------------------- sleep mode
    def sleep(self) -> None:
        """Free accelerator memory while the trainer runs (GPU + engine.
        enable_sleep_mode only; a no-op otherwise). Weights are offloaded
        (level 1), the KV cache is dropped. With a shared base the trainer
        computes with those weights: only the KV cache is released (a
        level-0 pause first, as vLLM requires), nothing else moves."""
        if self.sleep_enabled and not self._sleeping and getattr(self, "share_base", False):
            if getattr(self, "_kv_release_failed", False):
                return
            self.llm.sleep(level=0)
            try:
                self.llm.release_kv_cache_memory()
            except Exception as exc:  # not verified on every vLLM: keep the cache rather than stop the run
                self.llm.wake_up(tags=["scheduling"])
                self._kv_release_failed = True
                log.warning("engine.share_base: vLLM could not release its KV cache for the update (%s); it stays "
                            "resident, so the update has %s less memory than `plan` counts", exc, "the KV cache's")
                return
            self._sleeping = "kv_cache"
            return
        if self.sleep_enabled and not self._sleeping:
            self._loaded_before_sleep = set(self.llm.llm_engine.list_loras())
            self.llm.sleep(level=1)
            self._sleeping = True

    def wake_up(self) -> None:
        """Undo :meth:`sleep` (generate() calls it itself). A wake that
        dropped the loaded adapters (vLLM does after a level-2 sleep and a
        weight reload) gets every served version registered again."""
        if self._sleeping:
            kv_only = self._sleeping == "kv_cache"
            self.llm.wake_up(tags=["kv_cache", "scheduling"] if kv_only else None)
            self._sleeping = False
            for lora_id in self._pending_removals:
                self.llm.llm_engine.remove_lora(lora_id)
            self._pending_removals.clear()
            if kv_only:  # weights and loaded adapters never left
                return
            loaded = set(self.llm.llm_engine.list_loras())
            wanted = getattr(self, "_loaded_before_sleep", set())
            missing = [s for s in self._served.values() if s.version in wanted and s.version not in loaded]
            for served in missing:
                self.llm.llm_engine.add_lora(served.request)
            if missing:
                log.info("vLLM woke without %d adapter(s); registered again", len(missing))

