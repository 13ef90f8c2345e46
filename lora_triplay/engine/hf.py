"""transformers + PEFT engine: one `generate` serves a mix of adapters.

Each row of a batch has its own adapter (`__base__` = adapters off), so red,
blue, eval and base requests share one forward. Switching with
`set_adapter` per request instead walks every module (~30 ms a switch
measured on SmolLM2-135M) and serialises the batch. The engine shares its
weights with the trainer, so a sync is free.

Two ways to run a mixed batch, same numbers (tests/test_engine_hf.py): the
fast path (`fastpath.py`: stacked LoRA GEMMs, an in-place KV cache, grouped
decode attention; `fastgemm.py`: oneDNN GEMMs on CPU, q/k/v and gate/up as
one GEMM each, a blocked lm_head) and PEFT's own per-row `adapter_names`, kept as the
reference and for models the fast path does not cover
(`LORA_TRIPLAY_FAST_ENGINE=0` forces it).
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import torch

from ..errors import UserError
from ..training.forward import MIN_SHARED_PREFIX
from ..training.precision import widened
from ..training.sharding import Lockstep, is_sharded
from . import choice_tree, fastpath, prefix_groups
from .base import BASE, ChatTokens, Completion, Request, Sampling, choose, row_seed
from .decode import Decode

PEFT_BASE = "__base__"


class HFEngine(ChatTokens):
    def __init__(self, model, tokenizer, *, chat_kwargs: dict | None = None, max_batch_size: int = 64, lora=None):
        self.model = model
        self.tokenizer = tokenizer
        self.chat_kwargs = dict(chat_kwargs or {})
        self.max_batch_size = max_batch_size
        self.lora = lora  # recipe LoraConfig, for loading snapshots
        self.eos_ids = self.eos_set(model.generation_config, tokenizer)
        self.pad_id = tokenizer.pad_token_id
        self.fast = os.environ.get("LORA_TRIPLAY_FAST_ENGINE", "1") != "0"
        self._multilora = None
        self._serving: list[str] | None = None  # PEFT names of the batch being served (fast path)
        # a base sharded across processes (model.fsdp, sharding.py): every
        # call keeps its forwards in step with the other ranks'
        self.lockstep = None
        if is_sharded(model):
            dummy = torch.tensor([[self.pad_id]], device=next(model.parameters()).device)

            @torch.no_grad()
            def forward_to_keep_step():
                self.model(input_ids=dummy, use_cache=False)

            self.lockstep = Lockstep(forward_to_keep_step)

    def _in_step(self):
        return self.lockstep.call() if self.lockstep is not None else contextlib.nullcontext()

    # ------------------------------------------------------------- adapters
    def _peft_name(self, name: str) -> str:
        """The PEFT adapter of a request: the name as given (the game names
        its adapters), or PEFT's base for `base`."""
        if name == BASE:
            return PEFT_BASE
        if not hasattr(self.model, "peft_config"):
            raise KeyError(f"adapter {name!r}: this engine serves a plain model (base only)")
        if name not in self.model.peft_config:
            known = ", ".join(self.adapters())
            raise KeyError(f"adapter {name!r} is not loaded; known: {known}")
        return name

    def adapters(self) -> list[str]:
        return [BASE] + list(getattr(self.model, "peft_config", {}))

    def load_adapter(self, name: str, folder: str) -> None:
        from ..model import add_frozen_adapter

        add_frozen_adapter(self.model, name, Path(folder), self.lora)

    def remove_adapter(self, name: str) -> None:
        """Drop a frozen snapshot adapter (roles stay)."""
        if "@" in name and name in getattr(self.model, "peft_config", {}):
            self.model.delete_adapter(name)

    def sync_adapter(self, name: str) -> None:
        """The trainer updates these very tensors: nothing to copy."""

    def sleep(self) -> None:
        """Nothing to free: the engine is the trainer's own model."""

    def wake_up(self) -> None:
        """See :meth:`sleep`."""

    # ----------------------------------------------------------- generation
    def generate(self, requests: Sequence[Request], sampling: Sampling) -> list[list[Completion]]:
        with self._in_step():
            return self._generate(requests, sampling)

    def _generate(self, requests: Sequence[Request], sampling: Sampling) -> list[list[Completion]]:
        choice_reqs, gen = self.split(requests, self._peft_name)
        self._check_length(max((len(ids) for *_, ids in gen), default=0), sampling.max_new_tokens)
        if sampling.seed is None and not sampling.greedy:
            # One draw from torch's global RNG (saved and restored with the
            # run), then a generator per row seeded by (request, sample):
            # a row samples the same tokens however the batch around it is
            # made up, as vLLM's per-request seeds do (engine/vllm.py).
            sampling = replace(sampling, seed=int(torch.randint(0, 2**31 - 1, (1,))))
        # one row per sample: (request, sample, adapter, prompt ids)
        rows = [(r_i, s_i, peft_name, ids) for r_i, req, peft_name, ids in gen for s_i in range(req.n)]
        results: list[list[Completion | None]] = [[None] * req.n for req in requests]
        with self._serving_requests(requests):
            self._generate_all(requests, rows, choice_reqs, results, sampling)
        return results  # type: ignore[return-value]

    def _check_length(self, prompt: int, new: int) -> None:
        """A prompt (a pasted document, a 100 KB request file) that with its
        answer passes the positions the base was trained on: one line, not
        minutes of degraded output on a CPU or an out-of-memory on a GPU."""
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if isinstance(limit, int) and prompt + new > limit:
            raise UserError(f"a prompt of {prompt} tokens and its {new} new ones pass the base's {limit} positions "
                            "(max_position_embeddings); shorten the request, or lower --max-new-tokens")

    @contextlib.contextmanager
    def _serving_requests(self, requests: Sequence[Request]):
        """Eval mode and the fast path for these requests' adapters, unless a
        call around this one (generate asking score_choices) already serves."""
        if self._serving is not None:
            yield
            return
        was_training = self.model.training
        self.model.eval()  # PEFT refuses per-row adapter_names in training mode
        try:
            with self._serve(list(dict.fromkeys(self._peft_name(r.adapter) for r in requests))):
                yield
        finally:
            self.model.train(was_training)

    def _generate_all(self, requests, rows, choice_reqs, results, sampling) -> None:
        if choice_reqs:
            for r_i, comps in zip(choice_reqs, choose(self, [requests[i] for i in choice_reqs], sampling, choice_reqs)):
                for s_i, comp in enumerate(comps):
                    comp.request_index, comp.sample_index = r_i, s_i
                results[r_i] = comps
        for chunk in self._batches([row[3] for row in rows]):
            part = [rows[i] for i in chunk]
            for (r_i, s_i, _, _), comp in zip(part, self._generate_rows(part, sampling)):
                comp.adapter, comp.request_index, comp.sample_index = requests[r_i].adapter, r_i, s_i
                results[r_i][s_i] = comp

    def _batches(self, prompts: list[list[int]]) -> list[list[int]]:
        """Indices cut into batches of max_batch_size rows (the last one
        shorter), in sorted token order so that prompts sharing a long
        prefix (a judge's template, a role's system prompt, one expert's
        instruction) sit together and _prefill computes that prefix once per
        batch. Groups are packed, never kept apart: a decode step costs a GPU
        about the same for 1 row as for 64 (it reads every weight once), so
        one batch per distinct prompt ran 64-row rollouts of an 8B base at
        52 tokens/s (bench/results/gpu_check.json, 2026-11-30). Results go
        back in request order."""
        order = sorted(range(len(prompts)), key=lambda i: prompts[i])
        size = self.max_batch_size
        return [order[k : k + size] for k in range(0, len(order), size)]

    # -------------------------------------------------------------- forward
    @contextlib.contextmanager
    def _serve(self, names: list[str]):
        """The fast path for this call's adapters, where the model allows it."""
        if not self.fast or not hasattr(self.model, "peft_config"):
            yield
            return
        if self._multilora is None:
            self._multilora = fastpath.MultiLora(self.model)
            fastpath.register_attention()
        if not self._multilora.supported:
            yield
            return
        attn = fastpath.DECODE_ATTENTION if self.model.config._attn_implementation == "sdpa" else None
        self._serving = names
        try:
            with self._multilora.serving(names), fastpath.attention(self.model, attn):
                yield
        finally:
            self._serving = None

    def _forward(self, names: list[str], **kwargs):
        """One model forward where row i uses adapter names[i]."""
        if self.lockstep is not None:
            self.lockstep.turn()
        if self._serving is not None:
            index = torch.tensor([self._serving.index(n) for n in names], device=kwargs["input_ids"].device)
            self._multilora.rows(index)
            return self.model(**kwargs)
        if not hasattr(self.model, "peft_config"):  # a plain model: base rows only
            return self.model(**kwargs)
        return self.model(adapter_names=list(names), **kwargs)

    def _new_cache(self, capacity: int):
        return fastpath.reserved_cache(self.model, capacity) if self._serving is not None else None

    def _can_assemble(self) -> bool:
        """Whether prefill may lay several prefix groups into one cache (ours)."""
        return self._serving is not None and fastpath.supports_reserved(self.model)

    MIN_SHARED_PREFIX = MIN_SHARED_PREFIX  # tokens; below this a separate prefix forward costs more than it saves

    def _prefix_groups(self, prompts: list[list[int]], names: list[str], several: bool) -> list[int]:
        """Per row, the length of the prefix it shares with its group (0:
        none), for the cheapest plan of groups (prefix_groups.py). With
        `several` False (no cache to assemble groups into) the whole batch
        is one group."""
        return prefix_groups.plan(prompts, names, self.MIN_SHARED_PREFIX, several)

    def _prefix_cache(self, cache, prompts, names, shared: list[int], width: int, device):
        """Fill `cache` with every row's shared prefix, right-aligned in the
        first `width` columns (the columns before it are padding, masked):
        one forward per group over its distinct adapters."""
        groups: dict[tuple, list[int]] = {}
        for i, n in enumerate(shared):
            if n:
                groups.setdefault(tuple(prompts[i][:n]), []).append(i)
        parts = []
        for prefix, rows in groups.items():
            distinct = list(dict.fromkeys(names[i] for i in rows))
            n = len(prefix)
            ids = torch.tensor(prefix, device=device).expand(len(distinct), n)
            out = self._forward(distinct, input_ids=ids, position_ids=torch.arange(n, device=device).expand(len(distinct), n),
                                use_cache=True, logits_to_keep=1)
            pick = torch.tensor([distinct.index(names[i]) for i in rows], device=device)
            parts.append((torch.tensor(rows, device=device), n, pick, out.past_key_values))
        for layer in range(len(parts[0][3].layers)):
            k0, v0 = parts[0][3].layers[layer].keys, parts[0][3].layers[layer].values
            keys = k0.new_zeros((len(prompts), k0.shape[1], width, k0.shape[3]))
            values = v0.new_zeros((len(prompts), v0.shape[1], width, v0.shape[3]))
            for rows, n, pick, sub in parts:
                keys[rows, :, width - n :] = sub.layers[layer].keys[pick]
                values[rows, :, width - n :] = sub.layers[layer].values[pick]
            cache.update(keys, values, layer)
        return cache

    def _prefill(self, prompts: list[list[int]], names: list[str], device, leave_last: bool, reserve: int = 0):
        """Lay rows out as [right-aligned shared prefix | left-padded suffix]
        and run them through the model once: a judge's or a role's long
        system prompt is computed once per adapter of its group, not once per
        row (what vLLM's prefix cache does), and groups with different
        prefixes still share the batch. Returns (ids, mask, positions, cache,
        next-token logits); the cache covers every column, or all but the
        last with `leave_last`, and has room for `reserve` more tokens."""
        shared = self._prefix_groups(prompts, names, several=self._can_assemble())
        P = max(shared)
        suffixes = [p[n:] for p, n in zip(prompts, shared)]
        width = max(len(x) for x in suffixes)
        cache = self._new_cache(P + width + reserve)
        ids = torch.full((len(prompts), P + width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, (prompt, n, suffix) in enumerate(zip(prompts, shared, suffixes)):
            ids[i, P - n : P] = torch.tensor(prompt[:n], dtype=torch.long)
            mask[i, P - n : P] = 1
            ids[i, P + width - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
            mask[i, P + width - len(suffix) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        last = None
        if P and cache is not None:
            cache = self._prefix_cache(cache, prompts, names, shared, P, device)
        elif P:  # one group, transformers' own cache
            distinct = list(dict.fromkeys(names))
            n = len(distinct)
            out = self._forward(distinct, input_ids=ids[:1, :P].expand(n, P), position_ids=positions[:1, :P].expand(n, P),
                                past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache = out.past_key_values
            cache.batch_select_indices(torch.tensor([distinct.index(x) for x in names], device=device))
        end = ids.shape[1] - int(leave_last)
        if end > P:
            out = self._forward(names, input_ids=ids[:, P:end], attention_mask=mask[:, :end], position_ids=positions[:, P:end],
                                past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache, last = out.past_key_values, widened(out.logits[:, -1, :])
        return ids, mask, positions, cache, last

    @torch.no_grad()
    def _generate_rows(self, rows, sampling: Sampling) -> list[Completion]:
        """Generate for rows that may repeat a prompt (n > 1): each distinct
        (prompt, adapter) is prefilled once, with the batch's shared prefix
        once, and the KV cache is then shared by its samples.

        Our own decode loop rather than `model.generate`: it keeps only the
        current step's logits (generate's `output_logits` keeps B x T x V
        for the whole rollout: 4.9 GB per row at 8,192 tokens and Qwen3's
        vocabulary) and records each sampled token's raw log-prob as it
        goes; rows that finish leave the batch."""
        device = next(self.model.parameters()).device
        keys = list(dict.fromkeys((r[0], r[2]) for r in rows))
        first = {key: i for i, key in reversed(list(enumerate((r[0], r[2]) for r in rows)))}
        uniq = [rows[first[key]] for key in keys]
        u_ids, u_mask, u_pos, cache, last = self._prefill([r[3] for r in uniq], [r[2] for r in uniq], device, leave_last=False,
                                                          reserve=sampling.max_new_tokens)
        where = {key: i for i, key in enumerate(keys)}
        index = torch.tensor([where[(r[0], r[2])] for r in rows], device=device)
        cache.batch_select_indices(index)
        seeds = None if sampling.greedy else [row_seed(sampling.seed, r[0], r[1]) for r in rows]
        decode = Decode(sampling, self.eos_ids, len(rows), device, seen_ids=(u_ids[index], u_mask[index]), seeds=seeds)
        tokens, logps, lengths, finished = decode.run(
            self._forward, cache, u_mask[index], u_pos[index, -1] + 1, last[index], [r[2] for r in rows], self.pad_id
        )
        comps = []
        for i, (_, _, _, prompt) in enumerate(rows):
            n = int(lengths[i])
            kept = tokens[i, :n].tolist()
            comps.append(
                Completion(
                    adapter="",
                    text=self.tokenizer.decode(kept, skip_special_tokens=True),
                    prompt_ids=list(prompt),
                    token_ids=kept,
                    logprobs=logps[i, :n].tolist(),
                    finished=bool(finished[i]),
                )
            )
        return comps

    # ------------------------------------------------------- forced choice
    def score_choices(self, requests: Sequence[Request]) -> list[list[list[float]]]:
        """Per request, per choice: log-probs of the choice's tokens (EOS
        included) after the chat prompt, under the request's adapter. The
        prompt is prefilled once and its choices scored after it as one
        token tree (choice_tree.py), or as one row per choice on a cache
        copy where the model cannot take a tree mask.
        Served by the fast path like generate (a judge's direct calls were
        PEFT's per-adapter loop: x1.56 the CPU time on 64 judged pairs)."""
        with self._in_step(), self._serving_requests(requests):
            return self._score_choices(requests)

    @torch.no_grad()
    def _score_choices(self, requests: Sequence[Request]) -> list[list[list[float]]]:
        device = next(self.model.parameters()).device
        out: list[list[list[float]]] = [[] for _ in requests]
        prompts = [self.encode(r.messages) for r in requests]
        score = self._score_tree if self._tree_attention() else self._score_rows
        for part in self._batches(prompts):
            names = [self._peft_name(requests[i].adapter) for i in part]
            choices = [[self.choice_ids(c) for c in requests[i].choices] for i in part]
            for i, scores in zip(part, score([prompts[i] for i in part], names, choices, device)):
                out[i] = scores
        return out

    def _tree_attention(self) -> bool:
        """Whether choices may be scored as a token tree: a custom 4D mask
        needs every layer to be plain full attention (a sliding window or a
        recurrent layer cannot branch) and an attention that reads a boolean
        mask (eager adds the mask to its scores)."""
        attn = self.model.config._attn_implementation
        return fastpath.supports_reserved(self.model) and attn in ("sdpa", fastpath.DECODE_ATTENTION)

    def _score_tree(self, prompts, names, choices, device) -> list[list[list[float]]]:
        """One row per prompt, its choices as a tree after it (choice_tree.py)."""
        tree = choice_tree.build(choices, self.pad_id)
        _, mask, pos, cache, last = self._prefill(prompts, names, device, leave_last=False, reserve=tree.width)
        node_logp = None
        if tree.width:
            logits = self._forward(names, input_ids=tree.ids.to(device), attention_mask=choice_tree.attention_mask(tree, mask),
                                   position_ids=pos[:, -1:] + 1 + tree.depth.to(device), past_key_values=cache,
                                   use_cache=True).logits
            node_logp = torch.log_softmax(widened(logits), -1)
        return choice_tree.gather_scores(tree, torch.log_softmax(last, -1), node_logp, choices)

    def _score_rows(self, prompts, names, choices, device) -> list[list[list[float]]]:
        """One row per (prompt, choice), the prompt's cache copied to each."""
        rows = [(b, toks) for b, per_prompt in enumerate(choices) for toks in per_prompt]
        C = max(len(c) for _, c in rows)
        _, mask, pos, cache, last = self._prefill(prompts, names, device, leave_last=False, reserve=C)
        first_logp = torch.log_softmax(last, -1)
        index = torch.tensor([b for b, _ in rows], device=device)
        c_ids = torch.full((len(rows), C), self.pad_id, dtype=torch.long, device=device)
        c_mask = torch.zeros_like(c_ids)
        for r, (_, toks) in enumerate(rows):
            c_ids[r, : len(toks)] = torch.tensor(toks)
            c_mask[r, : len(toks)] = 1
        cache.batch_select_indices(index)
        full_mask = torch.cat([mask[index], c_mask], dim=1)
        c_pos = pos[index, -1:] + 1 + torch.arange(C, device=device)
        logits = self._forward([names[b] for b, _ in rows], input_ids=c_ids, attention_mask=full_mask, position_ids=c_pos,
                               past_key_values=cache, use_cache=True).logits
        logp = torch.log_softmax(widened(logits), -1)
        out: list[list[list[float]]] = [[] for _ in prompts]
        for r, (b, toks) in enumerate(rows):
            lp = [first_logp[b, toks[0]].item()]
            lp += [logp[r, t - 1, toks[t]].item() for t in range(1, len(toks))]
            out[b].append(lp)
        return out
