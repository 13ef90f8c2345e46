"""Fixed judges: each maps (prompt, response, expected)
to one of negative / rejective / positive (or None when its answer does not
parse), and carries a `name` that every result records.

* `rules` (:class:`RulesJudge`): the refusal detector of refusals.py (our
  phrases and the prefixes of the HarmBench / JailbreakBench / XSTest
  refusal judges). A refusal (or an empty answer) is
  `rejective`, or `positive` on a harmful prompt when it goes on to offer
  safe guidance; any other answer is `negative` on a harmful prompt and
  `positive` on a benign one. It never reads the content, so it
  over-counts attacks whose answer is harmless without refusing, and it
  counts a refusal that still leaks content as rejective: a cheap, fixed,
  reproducible yardstick, not a safety classifier.
* `openai:MODEL@URL` (:class:`OpenAIJudge`): any OpenAI-compatible chat
  completions endpoint, asked with a game's judge template (TriPlay: its
  eval template). URL is the API
  base (`http://host:8000/v1`; `/chat/completions` is appended unless
  present), reached through the `openai` client. The API key is read from
  `LORA_TRIPLAY_JUDGE_API_KEY` or `OPENAI_API_KEY` and only ever sent as a
  request header: never logged, never stored, and scrubbed from error
  messages.

The judges that need a TriPlay run (its eval adapter, its expert panel) are
triplay/judges.py's.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Callable, Sequence

from ..errors import UserError
from .parsing import LABELS, parse_label
from .refusals import rules_label

API_KEY_ENVS = ("LORA_TRIPLAY_JUDGE_API_KEY", "OPENAI_API_KEY")

class JudgeError(UserError):
    """A judge cannot be built or reached; the message is one line with the fix."""


@dataclass(frozen=True)
class Case:
    prompt: str
    response: str
    expected: str = "harmful"  # harmful | benign: what the rules judge assumes
    request: str | None = None  # the basic request `prompt` wraps, if any (for a judge that reads it instead)


class RulesJudge:
    name = "rules"

    def __call__(self, cases: Sequence[Case]) -> list[str | None]:
        return [rules_label(c.response, c.expected) for c in cases]


# --------------------------------------------------------------- endpoint

_ENDPOINT = re.compile(r"^openai:(?P<model>[^@\s]+)@(?P<url>https?://\S+)$")


def is_endpoint(spec: str) -> bool:
    return spec.startswith("openai:")


def parse_endpoint(spec: str) -> tuple[str, str]:
    m = _ENDPOINT.match(spec.strip())
    if m is None:
        raise JudgeError(f"{spec!r} is not `openai:MODEL@URL`; e.g. openai:gpt-4o-mini@https://api.openai.com/v1")
    return m.group("model"), m.group("url")


def _api_key() -> str | None:
    for env in API_KEY_ENVS:
        if os.environ.get(env):
            return os.environ[env]
    return None


class ChatEndpoint:
    """An OpenAI-compatible chat completions endpoint, through the `openai`
    client (its retries on 429/5xx and connection errors, its timeouts);
    many conversations run concurrently on one asyncio loop."""

    def __init__(self, spec: str, *, timeout: float = 120.0, retries: int = 2, workers: int = 4):
        self.model, url = parse_endpoint(spec)
        url = url.rstrip("/")
        self.base_url = url.removesuffix("/chat/completions")
        self.name = f"openai:{self.model}@{url}"
        self.timeout, self.retries, self.workers = timeout, retries, workers

    def _scrub(self, text: str) -> str:
        key = _api_key()
        return text.replace(key, "***") if key else text

    def _error(self, exc: Exception) -> JudgeError:
        import openai

        url = f"{self.base_url}/chat/completions"
        if isinstance(exc, openai.APIStatusError):
            hint = " (set LORA_TRIPLAY_JUDGE_API_KEY)" if exc.status_code in (401, 403) else ""
            return JudgeError(self._scrub(f"{url}: HTTP {exc.status_code}{hint}"))
        if isinstance(exc, (openai.APIConnectionError, openai.APITimeoutError)):
            return JudgeError(self._scrub(f"{url}: cannot reach the endpoint ({type(exc).__name__}); check the URL and that the server runs"))
        return JudgeError(self._scrub(f"{url}: the answer is not an OpenAI chat completion ({type(exc).__name__})"))

    def complete(self, conversations: Sequence[list[dict[str, str]]], max_tokens: int = 256,
                 temperature: float = 0.0) -> list[str]:
        if not conversations:
            return []
        import asyncio

        import openai

        async def run() -> list[str]:
            client = openai.AsyncOpenAI(base_url=self.base_url, api_key=_api_key() or "unused",
                                        max_retries=self.retries, timeout=self.timeout)
            gate = asyncio.Semaphore(self.workers)

            async def one(messages):
                async with gate:
                    out = await client.chat.completions.create(model=self.model, messages=messages,
                                                               max_tokens=max_tokens, temperature=temperature)
                    return str(out.choices[0].message.content or "")

            try:
                return await asyncio.gather(*(one(m) for m in conversations))
            finally:
                await client.close()

        try:
            return asyncio.run(run())
        except JudgeError:
            raise
        except Exception as exc:  # the client's errors, worded for the user
            raise self._error(exc) from None


def check_endpoints(named: Sequence[tuple[str, str]], collective=None) -> None:
    """Ask every distinct endpoint of `named` ((what names it, spec) pairs)
    one 1-token question, so a wrong URL, key or model name fails in one line
    before a model loads, not minutes into a run at its first judging. Only
    what cannot right itself fails (no connection, HTTP 401/403/404); a
    timeout, 429 or 5xx (a server waking up, a rate limit) is logged and
    left to the client's retries when the run asks for real. With several
    processes (`collective`) rank 0 asks and every rank raises what it found."""
    first: dict[str, str] = {}  # spec -> the first key naming it
    for what, spec in named:
        first.setdefault(spec, what)
    if not first:  # every rank reads the same recipe: all return here, or none
        return
    problem = ""
    if collective is None or collective.main:
        problem = next(filter(None, (_problem(spec, what) for spec, what in first.items())), "")
    if collective is not None and collective.world > 1:
        problem = collective.gather(problem)[0]
    if problem:
        raise JudgeError(problem)


def _problem(spec: str, what: str) -> str:
    """'' when `spec` answers (or may answer once it has woken up), else the error line."""
    import logging

    import openai

    endpoint = ChatEndpoint(spec)
    client = openai.OpenAI(base_url=endpoint.base_url, api_key=_api_key() or "unused", max_retries=0, timeout=30.0)
    try:
        client.chat.completions.create(model=endpoint.model, messages=[{"role": "user", "content": "Reply with OK."}], max_tokens=1)
        return ""
    except openai.APIStatusError as exc:
        if exc.status_code in (401, 403, 404):
            said = endpoint._scrub(" ".join(str(exc.message).split()))[:200]
            return f"{what}: {endpoint._error(exc)}: {said} (from a 1-token question asked before the run)"
        fault = f"HTTP {exc.status_code}"
    except openai.APITimeoutError:
        fault = "no answer in 30 s"
    except openai.APIConnectionError as exc:
        return f"{what}: {endpoint._error(exc)}"
    finally:
        client.close()
    logging.getLogger(__name__).warning("%s: %s answered a 1-token question with %s; going on (the real requests retry)",
                                        what, endpoint.name, fault)
    return ""


class OpenAIJudge:
    """An OpenAI-compatible endpoint asked with a judge template:
    `messages(prompt, response)` builds the chat (a game's own template,
    e.g. TriPlay's eval template), the answer is parsed like eval's."""

    def __init__(self, spec: str, messages: Callable[[str, str], list[dict]], max_tokens: int = 512, **kw):
        self.endpoint = ChatEndpoint(spec, **kw)
        self.name = self.endpoint.name
        self.messages, self.max_tokens = messages, max_tokens

    def __call__(self, cases: Sequence[Case]) -> list[str | None]:
        texts = self.endpoint.complete([self.messages(c.prompt, c.response) for c in cases], self.max_tokens)
        return [parse_label(t, LABELS).label for t in texts]


def make_judge(spec: str, messages: Callable[[str, str], list[dict]] | None = None) -> RulesJudge | OpenAIJudge:
    """`rules`, or `openai:MODEL@URL` asked with `messages(prompt, response)`.
    (TriPlay's own judges, the run's eval adapter and the expert panel, are
    triplay/judges.py's.)"""
    spec = spec.strip()
    if spec == "rules":
        return RulesJudge()
    if is_endpoint(spec):
        if messages is None:
            raise JudgeError(f"judge {spec!r}: an endpoint needs a judge template (messages)")
        return OpenAIJudge(spec, messages)
    raise JudgeError(f"unknown judge {spec!r}; use rules or openai:MODEL@URL")
