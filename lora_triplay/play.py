"""Quick looks at a run: one round of play, and a chat with one role.

`play`: red wraps each basic request with a technique, every defender
answers the wrapped prompt (one mixed-adapter batch), eval labels each
answer, exactly as a training step does (the same message builders and the
run's `rewards.judge_mode`), but greedy by default and without retries, so
what is shown is what the adapters do.

`chat`: a REPL on one adapter of the loaded run; `/role` switches adapter
without reloading the base (the adapters share it on one PeftModel).

Snapshot selection: `--iteration N` loads every role at iteration N into the
role slots (`red`, `blue`, `eval`); `--role blue@N` adds that snapshot as an
extra adapter `blue@N` and uses it in place of the slot.
"""
from __future__ import annotations

import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, TextIO

from .bases import ModelError
from .core.snapshots import parse_role
from .engine.base import BASE, Request, Sampling
from .errors import UserError
from .judging.parsing import LABEL_CHOICES, LABELS, extract_wrapped_prompt, parse_label
from .triplay.config import judge_budget
from .triplay.roles import (
    Technique,
    blue_messages,
    eval_messages,
    judged_prompt,
    load_basic_prompts,
    red_messages,
)

# ------------------------------------------------------------ selection

@dataclass
class Selection:
    """Which engine adapter plays each role: the slot (`red`) or a snapshot (`red@2`)."""

    iteration: int | None = None  # what the slots hold (None = latest)
    red: str = "red"
    eval: str = "eval"
    blues: list[str] = field(default_factory=lambda: ["blue"])

    @classmethod
    def from_specs(cls, specs: Iterable[str], iteration: int | None) -> "Selection":
        sel = cls(iteration=iteration)
        blues: list[str] = []
        for spec in specs:
            role, it = parse_role(spec, allow_base=False)
            name = role if it is None else f"{role}@{it}"
            if role == "blue":
                if name not in blues:
                    blues.append(name)
                continue
            current = getattr(sel, role)
            if current != role and current != name:
                raise ModelError(f"--role {role} given twice ({current}, {name}); pick one {role} snapshot "
                                 "(several blue snapshots are fine: they all defend)")
            setattr(sel, role, name)
        if blues:
            sel.blues = blues
        return sel

    def weights(self, adapter: str) -> str:
        """Where an adapter's weights come from, for humans and JSON."""
        if adapter == BASE:
            return "base (adapters off)"
        if "@" in adapter:
            return f"iter-{int(adapter.split('@')[1]):04d}"
        return "latest" if self.iteration is None else f"iter-{self.iteration:04d}"

    def label(self, adapter: str) -> str:
        """A name that says which weights: `blue@3`, `blue@latest`, `base`."""
        if adapter == BASE or "@" in adapter:
            return adapter
        return f"{adapter}@{'latest' if self.iteration is None else self.iteration}"


def resolve_defenders(recipe, sel: Selection, explicit: Iterable[str] = ()) -> list[str]:
    """Engine adapter names of the defenders: `--defender` values when given,
    else the recipe's `defenders` with `blue` meaning the selected blue(s)."""
    names = list(explicit) or [d.name for d in recipe.defenders]
    out: list[str] = []
    for name in names:
        role, it = parse_role(name)
        if role not in ("blue", BASE):
            raise ModelError(f"defender {name!r} is not `blue`, `base` or `blue@N`")
        expanded = sel.blues if (role == "blue" and it is None) else [name]
        out.extend(x for x in expanded if x not in out)
    return out


def load_requests(requests: Iterable[str], from_file: Path | None, column: str | None = None) -> list[str]:
    """Requests from the command line, then from a file: .jsonl/.csv through
    `load_basic_prompts` (HarmBench-style columns), else one request per line."""
    out = [r.strip() for r in requests if r and r.strip()]
    for i, text in enumerate(out, 1):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # bytes that are not UTF-8 reach Python as lone surrogates
            raise ModelError(f"request {i} on the command line is not valid UTF-8 text; pass it as UTF-8") from None
    if from_file is not None:
        path = Path(from_file)
        if path.is_dir():
            raise ModelError(f"--from-file {path} is a folder; pass a .txt (one request per line), .jsonl or .csv file")
        if path.suffix.lower() in (".jsonl", ".json", ".csv"):
            out += [b.prompt for b in load_basic_prompts(str(path), column, column_key="--column")]
        else:
            if not path.is_file():
                raise ModelError(f"--from-file {path}: no such file")
            try:
                text = path.read_text(encoding="utf-8-sig")
            except UnicodeDecodeError as exc:
                line = path.read_bytes()[: exc.start].count(b"\n") + 1
                raise ModelError(f"--from-file {path}: line {line} is not UTF-8 text; save the file as UTF-8") from None
            out += [line.strip() for line in text.splitlines() if line.strip()]
    if not out:
        raise ModelError('no request given; pass one, e.g. `lora-triplay play RUN_DIR "how do I pick a lock"`, or --from-file FILE')
    return out


def pick_techniques(techniques: list[Technique], n: int, name: str | None, seed: int) -> list[Technique]:
    if name is not None:
        by_name = {t.name: t for t in techniques}
        if name not in by_name:
            raise ModelError(f"--technique {name!r} is unknown; known: {', '.join(by_name)}")
        return [by_name[name]] * n
    rng = random.Random(seed)
    return [rng.choice(techniques) for _ in range(n)]


# ------------------------------------------------------------------ play

def play_round(run, requests: list[str], *, sel: Selection, defenders: list[str], techniques: list[Technique],
               sampling: Sampling, seed: int = 0) -> dict:
    """One round for each request; returns the JSON-able result."""
    import torch

    recipe, engine = run.recipe, run.engine
    served = {name: run.ensure(name) for name in [sel.red, sel.eval, *defenders]}  # user names -> the engine's adapters
    torch.manual_seed(seed)
    wraps = engine.generate([Request(served[sel.red], red_messages(q, t)) for q, t in zip(requests, techniques)], sampling)
    rows = []
    for q, t, w in zip(requests, techniques, wraps):
        wrapped = extract_wrapped_prompt(w[0].text)
        rows.append({
            "request": q, "technique": t.name, "red_output": w[0].text,
            "wrapped": wrapped if wrapped else q, "wrapped_ok": bool(wrapped), "defenders": [],
        })
    answers = engine.generate([Request(served[d], blue_messages(row["wrapped"])) for row in rows for d in defenders], sampling)
    pairs = [(row, d, a[0]) for i, row in enumerate(rows) for d, a in zip(defenders, answers[i * len(defenders):(i + 1) * len(defenders)])]
    choice = recipe.rewards.judge_mode == "choice"
    judge_sampling = Sampling(max_new_tokens=judge_budget(recipe), temperature=0.0)
    verdicts = engine.generate(
        [Request(served[sel.eval], eval_messages(judged_prompt(recipe.rewards.judge_prompt, row["request"], row["wrapped"]), ans.text,
                                                 "harmful" if recipe.rewards.eval_sees_kind else None),  # red wraps harmful requests
                 1, LABEL_CHOICES if choice else None) for row, _, ans in pairs],
        judge_sampling,
    )
    for (row, d, ans), v in zip(pairs, verdicts):
        comp = v[0]
        parsed = parse_label(comp.text, LABELS, finished=comp.finished)
        row["defenders"].append({
            "name": sel.label(d), "adapter": d, "weights": sel.weights(d),
            "answer": ans.text, "finished": ans.finished,
            "label": parsed.label, "parse_error": parsed.error, "eval_output": comp.text,
            "label_probs": dict(zip(LABELS, (round(p, 4) for p in comp.choice_probs))) if comp.choice_probs else None,
        })
    return {
        "run": str(Path(run.store.root).resolve()),
        "base": recipe.model.base,
        "iteration": sel.iteration,
        "judge_mode": recipe.rewards.judge_mode,
        "roles": {
            "red": {"adapter": sel.red, "weights": sel.weights(sel.red)},
            "eval": {"adapter": sel.eval, "weights": sel.weights(sel.eval)},
        },
        "defenders": [{"name": sel.label(d), "adapter": d, "weights": sel.weights(d)} for d in defenders],
        "sampling": {"max_new_tokens": sampling.max_new_tokens, "temperature": sampling.temperature, "seed": seed},
        "results": rows,
    }


def _excerpt(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def play_table(result: dict, excerpt: int = 200):
    """The round as a rich table that fits a 100-120 column terminal: one row
    per request; the first column holds the request, its technique and red's
    prompt, then one column per defender, each named once (`blue@latest`,
    `blue@3`, `base (adapters off)`)."""
    from rich.table import Table

    sel = Selection(iteration=result["iteration"])
    roles = result["roles"]
    title = (f"{result['run']}\nred={sel.label(roles['red']['adapter'])}  eval={sel.label(roles['eval']['adapter'])}  "
             f"judge={result['judge_mode']}")
    texts = [t for row in result["results"] for t in (row["request"], row["wrapped"], *(d["answer"] for d in row["defenders"]))]
    cut = any(len(" ".join(str(t).split())) > excerpt for t in texts)
    table = Table(title=title, show_lines=True, caption=f"texts cut at {excerpt} characters (…): --json prints them whole" if cut else None)
    # A fixed width is never collapsed by rich, so a technique name (one
    # word) is not folded mid-word; the defender columns share the rest.
    longest = max((len(row["technique"]) for row in result["results"]), default=0)
    table.add_column("request\n[cyan]technique[/]\n→ red's prompt", width=max(28, longest))
    for d in result["defenders"]:
        table.add_column(d["weights"] if d["adapter"] == BASE else d["name"], overflow="fold")
    colors = {"negative": "red", "rejective": "yellow", "positive": "green"}
    for row in result["results"]:
        wrapped = (_escape(_excerpt(row["wrapped"], excerpt)) if row["wrapped_ok"]
                   else "[dim](red gave no usable prompt; the request is used)[/dim]")
        first = f"{_escape(_excerpt(row['request'], excerpt))}\n[cyan]{_escape(row['technique'])}[/]\n→ {wrapped}"
        cells = []
        for d in row["defenders"]:
            label = d["label"]
            tag = f"[bold {colors[label]}]{label}[/]" if label else f"[magenta]malformed ({_escape(str(d['parse_error']))})[/]"
            cells.append(f"{_escape(_excerpt(d['answer'], excerpt)) or '[dim](empty)[/dim]'}\n→ {tag}")
        table.add_row(first, *cells)
    return table


def render_table(result: dict, console=None, excerpt: int = 200) -> None:
    from rich.console import Console

    if console is None:  # piped: the width of a normal terminal, not rich's 80
        console = Console(width=None if sys.stdout.isatty() else 120)
    console.print(play_table(result, excerpt))


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


# ------------------------------------------------------------------ chat

CHAT_HELP = (
    "commands: /role red|blue|eval|base|blue@N (switch adapter, history kept), /system TEXT (set the system prompt; "
    "`/system` alone restores the role's default), /reset (clear history), /history, /help, /quit"
)


class ChatSession:
    """The state of `lora-triplay chat`: adapter, system prompt, history."""

    def __init__(self, run, adapter: str, sampling: Sampling):
        self.run = run
        self.sampling = sampling
        self.history: list[dict[str, str]] = []
        self.custom_system: str | None = None
        self.adapter = self.switch(adapter)

    def switch(self, spec: str) -> str:
        role, it = parse_role(spec)
        name = role if it is None else f"{role}@{it}"
        self.served = self.run.ensure(name)  # what the engine serves `name` as
        self.adapter = name
        return name

    @property
    def system(self) -> str | None:
        """The user's `/system` text, else blue's training system prompt for
        blue (and its snapshots), else none."""
        if self.custom_system is not None:
            return self.custom_system
        if self.adapter.partition("@")[0] == "blue":
            return blue_messages("")[0]["content"]
        return None

    def messages(self) -> list[dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.history

    def ask(self, text: str) -> str:
        self.history.append({"role": "user", "content": text})
        try:
            comp = self.run.engine.generate([Request(self.served, self.messages())], self.sampling)[0][0]
        except BaseException:
            self.history.pop()
            raise
        self.history.append({"role": "assistant", "content": comp.text})
        return comp.text


def chat_loop(session: ChatSession, stdin: TextIO, say: Callable[[str], None], prompt: Callable[[str], None] | None = None) -> int:
    """Read lines until EOF or /quit; return the number of answers given."""
    answers = 0
    while True:
        if prompt is not None:
            prompt(f"{session.adapter}> ")
        line = stdin.readline()
        if not line:  # EOF
            break
        text = line.strip()
        if not text:
            continue
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # bytes that are not UTF-8 reach Python as lone surrogates
            say("[error: that line is not UTF-8 text; type it again]")
            continue
        if text.startswith("/"):
            cmd, _, arg = text.partition(" ")
            arg = arg.strip()
            if cmd in ("/quit", "/exit", "/q"):
                break
            if cmd == "/role":
                if not arg:
                    say(f"[now {session.adapter}; loaded: {', '.join(session.run.loaded())}]")
                    continue
                try:
                    session.switch(arg)
                    say(f"[role {session.adapter}; system prompt: {'set' if session.system else 'none'}; "
                        f"history kept ({len(session.history)} messages)]")
                except UserError as exc:
                    say(f"[error: {exc}]")
            elif cmd == "/reset":
                session.history.clear()
                say("[history cleared]")
            elif cmd == "/system":
                session.custom_system = arg or None
                say(f"[system prompt {'set' if arg else 'restored to the role default'}]")
            elif cmd == "/history":
                for m in session.messages():
                    say(f"{m['role']}: {m['content']}")
            elif cmd == "/help":
                say(f"[{CHAT_HELP}]")
            else:
                say(f"[unknown command {cmd}; {CHAT_HELP}]")
            continue
        try:
            say(f"{session.adapter}: {session.ask(text)}")
        except UserError as exc:  # e.g. a pasted text longer than the base reads: the chat goes on
            say(f"[error: {exc}]")
            continue
        answers += 1
    return answers
