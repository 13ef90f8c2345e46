"""The three roles as data, the seed data loaders and the chat message builders.

No role classes: a role is a name, an adapter name and a description; what a
role *does* lives in its prompt templates (prompts/templates.yaml) and in its
reward. Red's and blue's texts reach a judge prompt only through
:func:`lora_triplay.judging.parsing.data_block`.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from lora_triplay.judging.parsing import data_block, escape_control_tokens

from ..benchmarks import EXPECTED
from ..errors import UserError
from ..tables import columns, parse_jsonl, read_rows


@dataclass(frozen=True)
class Role:
    name: str  # what users see: red, blue, eval
    adapter: str  # the PEFT adapter name inside the model
    description: str


# The PEFT adapter of eval is "evaluator": a submodule attribute named "eval"
# would shadow torch.nn.Module.eval() on the PEFT wrappers.
ROLES: dict[str, Role] = {
    "red": Role("red", "red", "attacker: rewrites a basic harmful request into a wrapped adversarial prompt"),
    "blue": Role("blue", "blue", "defender: answers prompts, refusing what is unsafe with safe constructive guidance"),
    "eval": Role("eval", "evaluator", "evaluator: classifies a (prompt, response) as negative, rejective or positive"),
}


ROLE_ADAPTERS = {name: role.adapter for name, role in ROLES.items()}  # TriPlay's game.roles
EVAL = ROLE_ADAPTERS["eval"]  # what the engine serves eval as


def adapter_name(role_or_request_name: str) -> str:
    """User-facing name -> internal adapter name: "eval" -> "evaluator",
    "eval@3" -> "evaluator@3"; "red", "blue@2", "base" are unchanged."""
    name, at, snapshot = role_or_request_name.partition("@")
    role = ROLES.get(name)
    return (role.adapter if role else name) + at + snapshot


def role_name(adapter: str) -> str:
    """Inverse of :func:`adapter_name`: "evaluator@3" -> "eval@3"."""
    name, at, snapshot = adapter.partition("@")
    for role in ROLES.values():
        if role.adapter == name:
            return role.name + at + snapshot
    return adapter


@dataclass(frozen=True)
class Technique:
    name: str
    description: str
    demo_basic: str
    demo_wrapped: str


@dataclass(frozen=True)
class BasicPrompt:
    id: str
    category: str
    prompt: str
    twin_of: str | None = None  # a benign request's harmful seed of the same topic (phases.blue.twin_groups)


class SeedDataError(UserError):
    """A seed data file cannot be used; the message is one line with the fix."""


# ------------------------------------------------------------- templates

_TEMPLATE_KEYS = (
    "red_system", "red_user", "blue_system", "eval_system", "eval_user",
    "semantic_system", "semantic_user", "expert_user",
)


@functools.lru_cache(maxsize=1)
def _templates() -> dict[str, Any]:
    text = resources.files("lora_triplay.triplay").joinpath("prompts/templates.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    missing = [k for k in (*_TEMPLATE_KEYS, "safety_experts", "utility_experts") if k not in data]
    if missing:  # a packaging or editing mistake, not a user error
        raise RuntimeError(f"prompts/templates.yaml lacks keys {missing}")
    kinds = yaml.safe_load(resources.files("lora_triplay.triplay").joinpath("prompts/eval_kind.yaml").read_text(encoding="utf-8"))
    if sorted(kinds) != sorted(EXPECTED):
        raise RuntimeError(f"prompts/eval_kind.yaml has keys {sorted(kinds)}, not {list(EXPECTED)}")
    return {**data, "eval_kind": kinds}


def load_templates() -> dict[str, Any]:
    """All prompt templates (a copy: callers may not edit the shared cache)."""
    return copy.deepcopy(_templates())


# ------------------------------------------------------------- seed data

PROMPT_COLUMNS = ("prompt", "goal", "Goal", "Behavior", "forbidden_prompt", "behavior")
CATEGORY_COLUMNS = ("category", "Category", "SemanticCategory", "risk_type")
ID_COLUMNS = ("id", "BehaviorID", "traceid")


def _builtin(name: str) -> tuple[str, str]:
    return f"<builtin {name}>", resources.files("lora_triplay.triplay").joinpath(f"prompts/{name}").read_text(encoding="utf-8")


def _read_rows(path: str | Path) -> tuple[str, list[dict[str, Any]]]:
    p = Path(path).expanduser()
    return str(p), read_rows(p, SeedDataError, "give an existing .csv or .jsonl path, or 'builtin'")


def load_techniques(path: str | None = None) -> list[Technique]:
    """The wrapping techniques: package data for None/"builtin", else a JSONL/CSV file."""
    if path is None or path == "builtin":
        name, text = _builtin("techniques.jsonl")
        rows = parse_jsonl(name, text, SeedDataError)
    else:
        name, rows = _read_rows(path)
    fields = ("name", "description", "demo_basic", "demo_wrapped")
    out = []
    for n, row in enumerate(rows, 1):
        missing = [f for f in fields if not str(row.get(f) or "").strip()]
        if missing:
            raise SeedDataError(f"{name}: technique {n} lacks {missing}; each needs {list(fields)}")
        out.append(Technique(*(str(row[f]).strip() for f in fields)))
    if not out:
        raise SeedDataError(f"{name}: no techniques found; add at least one row with {list(fields)}")
    return out


def load_basic_prompts(
    path: str | None = None, column: str | None = None, limit: int | None = None, column_key: str = "data.prompt_column"
) -> list[BasicPrompt]:
    """Basic harmful requests for red: package data for None/"builtin", else a
    JSONL or CSV file (HarmBench, JailbreakBench, StrongREJECT, S-Eval, ...).

    ``column`` names the request column; by default the first of
    PROMPT_COLUMNS present (`column_key`: the setting that gives it, for
    the errors). HarmBench's behaviours file keeps only its
    "standard" rows (contextual and copyright rows need other judging).
    """
    if limit is not None and limit < 0:
        raise SeedDataError(f"limit must be >= 0 or None, got {limit}; set data.limit accordingly")
    if path is None or path == "builtin":
        name, text = _builtin("basic_prompts.jsonl")
        rows = parse_jsonl(name, text, SeedDataError)
    else:
        name, rows = _read_rows(path)
    cols = columns(rows)
    if not rows:
        raise SeedDataError(f"{name}: no data rows; add at least one request")
    if column is None:
        column = next((c for c in PROMPT_COLUMNS if c in cols), None)
        if column is None:
            raise SeedDataError(
                f"{name}: no usable prompt column (found {cols}, looked for {list(PROMPT_COLUMNS)}); "
                f"set {column_key} to the column that holds the requests"
            )
    elif column not in cols:
        raise SeedDataError(f"{name}: column {column!r} not found (found {cols}); fix {column_key}")
    if "FunctionalCategory" in cols:
        rows = [r for r in rows if str(r.get("FunctionalCategory") or "").strip() == "standard"]
    cat_col = next((c for c in CATEGORY_COLUMNS if c in cols), None)
    id_col = next((c for c in ID_COLUMNS if c in cols), None)
    stem = Path(name.strip("<>").split()[-1]).stem
    out = []
    for i, row in enumerate(rows):
        prompt = str(row.get(column) or "").strip()
        if not prompt:
            continue  # blank cells are noise, not requests
        pid = str(row.get(id_col) or "").strip() if id_col else ""
        cat = str(row.get(cat_col) or "").strip() if cat_col else ""
        out.append(BasicPrompt(pid or f"{stem}-{i:04d}", cat or "unknown", prompt, str(row.get("twin_of") or "").strip() or None))
    if not out:
        raise SeedDataError(f"{name}: column {column!r} has no non-empty requests; check data.prompt_column")
    return out if limit is None else out[:limit]


# ------------------------------------------------------- message builders


def _chat(system: str, user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def red_messages(basic: str, technique: Technique) -> list[dict[str, str]]:
    t = _templates()
    fields = dict(technique=technique.name, description=technique.description,
                  demo_basic=technique.demo_basic, demo_wrapped=technique.demo_wrapped, basic=basic)
    return _chat(t["red_system"].format(**fields), t["red_user"].format(**fields))


def blue_messages(prompt: str) -> list[dict[str, str]]:
    # Red's text is blue's user turn: defuse chat-control tokens so red cannot
    # forge turns in blue's chat template (a tokenizer trick, not an attack we
    # want blue to learn about); everything else, obfuscation included, stays.
    return _chat(_templates()["blue_system"], escape_control_tokens(prompt))


def styled_blue_messages(prompt: str, style: str) -> list[dict[str, str]]:
    """Blue's chat with its own system prompt (`blue`) or one of
    templates.yaml's `warmup_styles` (refuse, guide, comply)."""
    if style == "blue":
        return blue_messages(prompt)
    return _chat(warmup_instruction(style), escape_control_tokens(prompt))


def warmup_instruction(style: str) -> str:
    """The system prompt of one of templates.yaml's `warmup_styles`."""
    return _templates()["warmup_styles"][style]


def warmup_opening(style: str) -> str:
    """The first words of a styled warm-start answer (templates.yaml
    `warmup_openings`; none for blue's own)."""
    return _templates().get("warmup_openings", {}).get(style, "")


def judged_prompt(view: str, basic: str, wrapped: str) -> str:
    """The user prompt eval reads beside an answer (`rewards.judge_prompt`):
    red's wrapped text (`wrapped`, the paper) or the basic request it wraps
    (`request`); a benign or unwrapped prompt is both."""
    return basic if view == "request" else wrapped


def eval_messages(prompt: str, response: str, kind: str | None = None) -> list[dict[str, str]]:
    """Eval's chat; with `kind` (harmful | benign: what the game asked, rewards.eval_sees_kind)
    its line of prompts/eval_kind.yaml goes before the classification request."""
    t = _templates()
    user = t["eval_user"].format(prompt=data_block("PROMPT", prompt), response=data_block("RESPONSE", response))
    if kind is not None:
        if kind not in EXPECTED:
            raise ValueError(f"eval_messages: kind {kind!r}; use one of {EXPECTED} or None")
        user = t["eval_kind"][kind].strip() + "\n\n" + user
    return _chat(t["eval_system"], user)


def semantic_messages(basic: str, wrapped: str) -> list[dict[str, str]]:
    t = _templates()
    user = t["semantic_user"].format(basic=data_block("BASIC", basic), wrapped=data_block("WRAPPED", wrapped))
    return _chat(t["semantic_system"], user)


def expert_messages(instruction: str, prompt: str, response: str) -> list[dict[str, str]]:
    """One expert's chat; ``instruction`` is one of templates' safety_experts / utility_experts."""
    t = _templates()
    user = t["expert_user"].format(prompt=data_block("PROMPT", prompt), response=data_block("RESPONSE", response))
    return _chat(instruction, user)
