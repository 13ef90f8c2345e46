"""The engine contract: generate for any mix of adapters in one call.

A request names the adapter that must answer it (`red`, `blue`, `eval`,
`base` for adapters off, or a frozen snapshot such as `blue@3`) and carries
chat messages; the engine returns one completion per sample. Both backends
(transformers+PEFT and vLLM) implement this protocol and must give the same
greedy tokens for the same adapter.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

BASE = "base"  # adapter name meaning "adapters off": the frozen base model


@dataclass(frozen=True)
class Sampling:
    """How to sample. temperature == 0 means greedy."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class Request:
    """One prompt for one adapter; `n` samples are drawn from it."""

    adapter: str
    messages: list[dict[str, str]]
    n: int = 1
    # Forced choice: the answer is exactly one of these strings (e.g. the
    # three `Label: ...` lines), picked by sequence log-probability: greedy
    # takes the most likely, sampling draws from their softmax / temperature.
    # A judge that cannot answer off-format, at the cost of one forward pass.
    choices: tuple[str, ...] | None = None
    # Text the answer is forced to start with (after the chat template's
    # assistant header); the completion continues it and excludes it. Helps
    # a small model into a format (a game's JSON reply).
    prefix: str = ""


@dataclass
class Completion:
    """One sampled answer.

    `prompt_ids` are the tokenized chat prompt (generation prompt included),
    `token_ids` the generated tokens (EOS included when it was produced),
    `logprobs` the log-probability of each generated token under the raw
    model distribution (before temperature), when the backend returns them.
    """

    adapter: str
    text: str
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float] | None = None
    finished: bool = True  # False when cut by max_new_tokens
    # its first tokens were forced (a game's opening, moved from the prompt
    # into token_ids after generation), not sampled from the policy
    off_policy: bool = False
    request_index: int = 0
    sample_index: int = 0
    # Forced choice only: the probability of each of the request's choices
    # (softmax of their sequence log-probs), for expected-value rewards.
    choice_probs: list[float] | None = None


@runtime_checkable
class Engine(Protocol):
    def generate(self, requests: Sequence[Request], sampling: Sampling) -> list[list[Completion]]:
        """Return, for each request, its `n` completions in order."""

    def load_adapter(self, name: str, folder: str) -> None:
        """Add (or replace) a frozen adapter served under `name`, e.g. `blue@3`."""

    def sync_adapter(self, name: str) -> None:
        """Make the engine serve the trainer's current weights of role adapter `name`."""

    def adapters(self) -> list[str]:
        """Names this engine can serve (roles, snapshots and `base`)."""

    def sleep(self) -> None:
        """Free accelerator memory for the policy update (vLLM sleep mode);
        the loop calls it before every update. A no-op where nothing frees."""

    def wake_up(self) -> None:
        """Get the memory back before rollouts; the loop calls it before
        every step's generation."""


class ChatTokens:
    """What both engines do the same way with the tokenizer (so both see the
    same token ids): the chat prompt, a forced choice's tokens, the EOS set.
    Needs `tokenizer`, `chat_kwargs` and `eos_ids` on the engine."""

    @staticmethod
    def eos_set(generation_config, tokenizer) -> list[int]:
        """The model's EOS ids (one or several) and the tokenizer's."""
        eos = getattr(generation_config, "eos_token_id", None)
        eos = list(eos) if isinstance(eos, (list, tuple)) else [eos]
        return sorted({e for e in eos + [tokenizer.eos_token_id] if e is not None})

    def encode(self, messages: list[dict[str, str]]) -> list[int]:
        out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **self.chat_kwargs)
        ids = out["input_ids"] if hasattr(out, "keys") else out
        return list(ids)

    def choice_ids(self, choice: str) -> list[int]:
        return list(self.tokenizer.encode(choice, add_special_tokens=False)) + [self.eos_ids[0]]

    def split(self, requests: Sequence[Request], resolve) -> tuple[list[int], list[tuple[int, Request, object, list[int]]]]:
        """(indices of the forced-choice requests, (index, request,
        resolve(adapter), prompt ids) of the ones to generate for); every
        adapter is resolved first, so an unknown one fails before any work."""
        choice, gen = [], []
        for i, req in enumerate(requests):
            adapter = resolve(req.adapter)
            if req.choices:
                choice.append(i)
            else:
                prefix = list(self.tokenizer.encode(req.prefix, add_special_tokens=False)) if req.prefix else []
                gen.append((i, req, adapter, self.encode(req.messages) + prefix))
        return choice, gen


def row_seed(seed: int, request: int, sample: int) -> int:
    """The generator seed of one sampled row: sample `sample` of request
    `request` (its index in the engine call) in a call seeded `seed`. Both
    engines seed rows this way, so a row samples the same tokens however the
    batch around it is made up (and on whichever rank serves it)."""
    return ((seed + request) * 1_000_003 + sample) % (2**63 - 1)


def choose(engine, requests: Sequence[Request], sampling: Sampling, indices: Sequence[int] | None = None) -> list[list[Completion]]:
    """Forced choice from the engine's `score_choices`, shared by both
    backends so the same scores give the same picks: greedy takes the most
    likely choice, sampling draws from softmax(total log-prob / temperature),
    seeded per row from `sampling.seed` when given (`indices`: each
    request's index in the engine call). `choice_probs` is the untempered
    softmax, for expected-value rewards."""
    import torch

    results = []
    indices = list(range(len(requests))) if indices is None else list(indices)
    for r_i, req, per_choice in zip(indices, requests, engine.score_choices(requests)):
        totals = torch.tensor([sum(lp) for lp in per_choice])
        probs = torch.softmax(totals, -1).tolist()
        prompt = engine.encode(req.messages)
        comps = []
        for k in range(req.n):
            if sampling.greedy:
                pick = int(totals.argmax())
            else:
                gen = None if sampling.seed is None else torch.Generator().manual_seed(row_seed(sampling.seed, r_i, k))
                pick = int(torch.multinomial(torch.softmax(totals / sampling.temperature, -1), 1, generator=gen))
            choice = req.choices[pick]
            comps.append(Completion(req.adapter, choice, prompt, engine.choice_ids(choice), per_choice[pick], True, choice_probs=probs))
        results.append(comps)
    return results
