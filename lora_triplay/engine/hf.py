"""transformers + PEFT engine: one `generate` serves a mix of adapters.

Each row of a batch names its adapter through PEFT's `adapter_names`
(`__base__` = adapters off), so red, blue, eval and base requests share one
forward. Switching with `set_adapter` per request instead walks every module
(~30 ms a switch measured on SmolLM2-135M) and serialises the batch.
The engine shares its weights with the trainer, so a sync is free.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

import torch

from ..roles import adapter_name
from .base import BASE, Completion, GenerationStats, Request, Sampling

PEFT_BASE = "__base__"


class HFEngine:
    def __init__(self, model, tokenizer, *, chat_kwargs: dict | None = None, max_batch_size: int = 64, lora=None):
        self.model = model
        self.tokenizer = tokenizer
        self.chat_kwargs = dict(chat_kwargs or {})
        self.max_batch_size = max_batch_size
        self.lora = lora  # recipe LoraConfig, for loading snapshots
        self.stats = GenerationStats()
        eos = model.generation_config.eos_token_id
        eos = list(eos) if isinstance(eos, (list, tuple)) else [eos]
        self.eos_ids = sorted({e for e in eos + [tokenizer.eos_token_id] if e is not None})
        self.pad_id = tokenizer.pad_token_id

    # ------------------------------------------------------------- adapters
    def _peft_name(self, name: str) -> str:
        if name == BASE:
            return PEFT_BASE
        internal = adapter_name(name)
        if internal not in self.model.peft_config:
            known = ", ".join(self.adapters())
            raise KeyError(f"adapter {name!r} is not loaded; known: {known}")
        return internal

    def adapters(self) -> list[str]:
        inverse = {"evaluator": "eval"}
        names = []
        for internal in self.model.peft_config:
            head, _, tail = internal.partition("@")
            names.append(inverse.get(head, head) + (f"@{tail}" if tail else ""))
        return [BASE] + names

    def load_adapter(self, name: str, folder: str) -> None:
        from ..model import add_frozen_adapter

        add_frozen_adapter(self.model, adapter_name(name), Path(folder), self.lora)

    def sync_adapter(self, name: str) -> None:
        """The trainer updates these very tensors: nothing to copy."""

    # ----------------------------------------------------------- generation
    def encode(self, messages: list[dict[str, str]]) -> list[int]:
        out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **self.chat_kwargs)
        ids = out["input_ids"] if hasattr(out, "keys") else out
        return list(ids)

    def generate(self, requests: Sequence[Request], sampling: Sampling) -> list[list[Completion]]:
        t0 = time.perf_counter()
        rows: list[tuple[int, int, str, list[int]]] = []  # (request, sample, adapter, prompt ids)
        choice_reqs: list[int] = []
        for r_i, req in enumerate(requests):
            peft_name = self._peft_name(req.adapter)
            if req.choices:
                choice_reqs.append(r_i)
                continue
            ids = self.encode(req.messages)
            rows.extend((r_i, s_i, peft_name, ids) for s_i in range(req.n))
        results: list[list[Completion | None]] = [[None] * req.n for req in requests]
        was_training = self.model.training
        self.model.eval()  # PEFT refuses per-row adapter_names in training mode
        try:
            if choice_reqs:
                for r_i, comps in zip(choice_reqs, self._choose([requests[i] for i in choice_reqs], sampling)):
                    for s_i, comp in enumerate(comps):
                        comp.request_index, comp.sample_index = r_i, s_i
                    results[r_i] = comps
            for start in range(0, len(rows), self.max_batch_size):
                for (r_i, s_i, _, _), comp in zip(rows[start : start + self.max_batch_size], self._generate_rows(rows[start : start + self.max_batch_size], sampling)):
                    comp.adapter, comp.request_index, comp.sample_index = requests[r_i].adapter, r_i, s_i
                    results[r_i][s_i] = comp
        finally:
            self.model.train(was_training)
        self.stats.requests += len(requests)
        self.stats.samples += len(rows)
        self.stats.seconds += time.perf_counter() - t0
        for req in requests:
            self.stats.per_adapter[req.adapter] = self.stats.per_adapter.get(req.adapter, 0) + req.n
        return results  # type: ignore[return-value]

    @torch.no_grad()
    def _generate_rows(self, rows, sampling: Sampling) -> list[Completion]:
        device = next(self.model.parameters()).device
        width = max(len(r[3]) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, (_, _, _, prompt) in enumerate(rows):
            ids[i, width - len(prompt) :] = torch.tensor(prompt)
            mask[i, width - len(prompt) :] = 1
        kwargs = dict(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            adapter_names=[r[2] for r in rows],
            max_new_tokens=sampling.max_new_tokens,
            do_sample=not sampling.greedy,
            repetition_penalty=sampling.repetition_penalty,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        if not sampling.greedy:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        else:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        out = self.model.generate(**kwargs)
        new = out.sequences[:, width:].cpu()
        # Raw (pre-temperature) log-probs of the sampled tokens, as vLLM reports them.
        logits = torch.stack(out.logits, dim=1).float() if out.logits else torch.zeros(len(rows), 0, 1)
        logp = torch.log_softmax(logits, dim=-1).gather(-1, new.to(logits.device).unsqueeze(-1)).squeeze(-1).cpu()
        comps = []
        for i, (_, _, _, prompt) in enumerate(rows):
            tokens = new[i].tolist()
            end, finished = len(tokens), False
            for j, tok in enumerate(tokens):
                if tok in self.eos_ids:
                    end, finished = j + 1, True
                    break
            kept = tokens[:end]
            self.stats.new_tokens += len(kept)
            comps.append(
                Completion(
                    adapter="",
                    text=self.tokenizer.decode(kept, skip_special_tokens=True),
                    prompt_ids=list(prompt),
                    token_ids=kept,
                    logprobs=logp[i, :end].tolist(),
                    finished=finished,
                )
            )
        return comps

    # ------------------------------------------------------- forced choice
    def choice_ids(self, choice: str) -> list[int]:
        return list(self.tokenizer.encode(choice, add_special_tokens=False)) + [self.eos_ids[0]]

    @torch.no_grad()
    def score_choices(self, requests: Sequence[Request]) -> list[list[list[float]]]:
        """Per request, per choice: log-probs of the choice's tokens (EOS
        included) after the chat prompt, under the request's adapter."""
        from ..grpo import _batch_tensors, token_logprobs, Sample

        device = next(self.model.parameters()).device
        items = []
        for r_i, req in enumerate(requests):
            prompt = self.encode(req.messages)
            for c_i, choice in enumerate(req.choices or ()):
                items.append((r_i, c_i, self._peft_name(req.adapter), Sample(prompt, self.choice_ids(choice), 0, 0.0)))
        out: list[list[list[float]]] = [[[] for _ in req.choices or ()] for req in requests]
        for start in range(0, len(items), self.max_batch_size):
            part = items[start : start + self.max_batch_size]
            ids, mask, pos, cmask, C = _batch_tensors([it[3] for it in part], self.pad_id, device)
            logp, _ = token_logprobs(self.model, ids, mask, pos, C, adapter_names=[it[2] for it in part])
            for row, (r_i, c_i, _, sample) in enumerate(part):
                out[r_i][c_i] = logp[row, : len(sample.completion_ids)].cpu().tolist()
        return out

    def _choose(self, requests: Sequence[Request], sampling: Sampling) -> list[list[Completion]]:
        scores = self.score_choices(requests)
        results = []
        for req, per_choice in zip(requests, scores):
            totals = torch.tensor([sum(lp) for lp in per_choice])
            probs = torch.softmax(totals, -1).tolist()
            comps = []
            for _ in range(req.n):
                if sampling.greedy:
                    pick = int(totals.argmax())
                else:
                    pick = int(torch.multinomial(torch.softmax(totals / sampling.temperature, -1), 1))
                choice = req.choices[pick]
                ids = self.choice_ids(choice)
                comps.append(Completion(req.adapter, choice, self.encode(req.messages), ids, per_choice[pick], True, choice_probs=probs))
            results.append(comps)
        return results
