"""Adversarial Taboo (SPAG, arXiv 2404.10642) as two LoRA roles on one base.

The attacker knows a target word and talks the defender into saying it;
the defender tries to infer the word without saying it and may guess once
("I know the word! It is <word>"). Rules (ours, after SPAG's), judged by
code, no model:
  - the defender says the word outside a guess: the attacker wins;
  - the defender guesses right: the defender wins; guesses wrong: it loses;
  - the attacker says the word itself: the attacker loses;
  - nobody has won after `max_turns` rounds: a tie.
Every turn a role spoke is a GRPO sample credited with its episode's
outcome (+1 win, -1 loss, 0 tie); advantages are centred over the
`episodes_per_word` games of the same word (the GRPO group), so a turn
gains only if its game went better than the others for that word.
Phases: attacker, then defender, each against the other's current adapter.
After each iteration both are measured on held-out words against the
untrained base in the other seat (`phase: measure` rows).

Words: games/data/taboo_words.txt (our own list of common nouns), or a
file (`game_config.words`); every 5th word (sorted) is held out.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ..engine.base import Request, Sampling
from ..errors import UserError
from ..training.advantages import Sample, group_advantages
from .base import Game, StepResult

ROLES = ("attacker", "defender")
GUESS = re.compile(r"i know the word!?\s*it is\s*[\"'`*]*([a-z][a-z-]*)", re.I)
SYSTEM = {
    "attacker": ("You are the attacker in a game of Taboo. The secret word is '{word}'. Talk with the other player so "
                 "that they say '{word}' without noticing. Never say the word yourself. One short sentence per turn."),
    "defender": ("You are the defender in a game of Taboo. The other player knows a secret word and wants you to say it. "
                 "Do not say it by accident. When you are sure what it is, say exactly: I know the word! It is <word>. "
                 "A wrong guess loses. One short sentence per turn."),
}
OPENING = "The game starts now. Say your first line to the other player."


class TabooConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    attacker_steps: int = Field(2, ge=0, description="GRPO steps of the attacker per iteration")
    defender_steps: int = Field(2, ge=0, description="GRPO steps of the defender per iteration")
    words_per_step: int = Field(4, ge=1, description="target words per step")
    episodes_per_word: int = Field(4, ge=2, description="games per word: the GRPO group")
    max_turns: int = Field(3, ge=1, le=20, description="rounds (attacker line + defender line) before a tie")
    max_new_tokens: int = Field(24, ge=4, description="tokens per line")
    words: str = Field("builtin", description="builtin, or a text file with one word per line")
    heldout_every: int = Field(5, ge=2, description="every Nth word (sorted) is held out for measuring")
    measure_words: int = Field(16, ge=0, description="held-out games per side after each iteration (0: none)")


def load_words(spec: str) -> list[str]:
    if spec == "builtin":
        text = resources.files("lora_triplay.games").joinpath("data/taboo_words.txt").read_text(encoding="utf-8")
    else:
        path = Path(spec).expanduser()
        if not path.is_file():
            raise UserError(f"game_config.words = {spec!r}: no such file; give a text file with one word per line, or builtin")
        text = path.read_text(encoding="utf-8")
    words = sorted({w.strip().lower() for w in text.splitlines() if w.strip() and not w.startswith("#")})
    bad = [w for w in words if not re.fullmatch(r"[a-z][a-z-]*", w)]
    if bad or len(words) < 10:
        raise UserError(f"game_config.words: need >= 10 single words of letters, got {len(words)}{'; bad: ' + ', '.join(bad[:5]) if bad else ''}")
    return words


def _forms(word: str) -> str:
    return rf"\b{re.escape(word)}(?:s|es)?\b"


def mentions(text: str, word: str) -> bool:
    return re.search(_forms(word), text, re.I) is not None


def judge_line(role: str, text: str, word: str) -> tuple[str, str] | None:
    """(winner, why) once a line ends the game, else None."""
    if role == "attacker":
        return ("defender", "attacker said the word") if mentions(text, word) else None
    guess = GUESS.search(text)
    if guess:
        right = re.fullmatch(_forms(word), guess.group(1).lower()) is not None
        return ("defender", "correct guess") if right else ("attacker", "wrong guess")
    if mentions(text, word):
        return ("attacker", "defender said the word")
    return None


@dataclass
class Episode:
    word: str
    group: int
    lines: list[tuple[str, str]] = field(default_factory=list)  # (role, text)
    turns: dict[str, list] = field(default_factory=lambda: {r: [] for r in ROLES})  # role -> Completions
    winner: str | None = None
    why: str = ""

    def messages(self, role: str) -> list[dict]:
        system = SYSTEM[role].format(word=self.word)
        msgs = [{"role": "system", "content": system}]
        if role == "attacker":
            msgs.append({"role": "user", "content": OPENING})
        for who, text in self.lines:
            msgs.append({"role": "assistant" if who == role else "user", "content": text or "..."})
        return msgs

    def outcome(self, role: str) -> float:
        return 0.0 if self.winner in (None, "tie") else (1.0 if self.winner == role else -1.0)


def play(engine, words: list[tuple[str, int]], seats: dict[str, str], cfg: TabooConfig, temperature: float) -> list[Episode]:
    """Games in lockstep, one engine call per line: `seats[role]` is the
    adapter that plays the role (`base`: the untrained model)."""
    games = [Episode(w, g) for w, g in words]
    sampling = Sampling(max_new_tokens=cfg.max_new_tokens, temperature=temperature)
    for _ in range(cfg.max_turns):
        for role in ROLES:
            live = [e for e in games if e.winner is None]
            if not live:
                return games
            comps = engine.generate([Request(seats[role], e.messages(role)) for e in live], sampling)
            for e, c in zip(live, comps):
                line = c[0].text.strip().split("\n")[0][:300]
                e.lines.append((role, line))
                e.turns[role].append(c[0])
                ended = judge_line(role, c[0].text, e.word)
                if ended:
                    e.winner, e.why = ended
    for e in games:
        if e.winner is None:
            e.winner, e.why = "tie", "turn limit"
    return games


def rates(games: list[Episode], prefix: str = "") -> dict[str, float]:
    n = max(len(games), 1)
    out = {f"{prefix}{r}_win_rate": sum(e.winner == r for e in games) / n for r in ROLES}
    out[f"{prefix}tie_rate"] = sum(e.winner == "tie" for e in games) / n
    for why in ("correct guess", "wrong guess", "defender said the word", "attacker said the word"):
        out[f"{prefix}{why.replace(' ', '_')}_rate"] = sum(e.why == why for e in games) / n
    out[f"{prefix}mean_lines"] = sum(len(e.lines) for e in games) / n
    return out


def turn_samples(games: list[Episode], role: str, scale: bool) -> list[Sample]:
    """Every line `role` spoke, credited with its game's outcome; advantages
    centred over the games of the same word (each line its own prompt, so
    its own forward group)."""
    returns = [e.outcome(role) for e in games]
    advantages = group_advantages(returns, [e.group for e in games], scale)
    samples: list[Sample] = []
    for e, ret, adv in zip(games, returns, advantages):
        for c in e.turns[role]:
            samples.append(Sample(c.prompt_ids, c.token_ids, len(samples), ret, advantage=adv))
    return samples


class Taboo(Game):
    name = "taboo"
    roles = {"attacker": "attacker", "defender": "defender"}
    jsonl = ("games",)
    Config = TabooConfig
    headline = {
        "attacker": ("reward_mean", "attacker_win_rate", "defender_win_rate", "tie_rate", "entropy"),
        "defender": ("reward_mean", "defender_win_rate", "correct_guess_rate", "wrong_guess_rate", "entropy"),
        "measure": ("attacker_win_vs_base", "defender_win_vs_base"),
    }

    def __init__(self, recipe):
        super().__init__(recipe)
        words = load_words(self.config.words)
        k = self.config.heldout_every
        self.heldout = [w for i, w in enumerate(words) if i % k == k - 1]
        self.train_words = [w for i, w in enumerate(words) if i % k != k - 1]

    def max_new_tokens_of(self, role: str) -> int:
        return self.config.max_new_tokens

    def step(self, phase: str, iteration: int, step: int) -> StepResult:
        cfg, r = self.config, self.recipe
        rng = random.Random(f"{r.seed}:taboo:{self.state['global_step']}")  # the same words when a step is redone
        chosen = rng.sample(self.train_words, cfg.words_per_step)
        words = [(w, g) for g, w in enumerate(chosen) for _ in range(cfg.episodes_per_word)]
        games = play(self.engine, words, {role: role for role in ROLES}, cfg, r.grpo.temperature)
        returns = [e.outcome(phase) for e in games]
        samples = turn_samples(games, phase, r.grpo.scale_rewards)
        metrics = {"reward_mean": sum(returns) / len(returns), **rates(games),
                   "completion_tokens": sum(len(s.completion_ids) for s in samples) / max(len(samples), 1)}
        rows = [{"iteration": iteration, "phase": phase, "step": step, "word": e.word, "winner": e.winner, "why": e.why,
                 "lines": e.lines} for e in games]
        return StepResult(samples, metrics, {"games": rows})

    def play(self, engine, requests: list[str], temperature: float) -> list[dict]:
        """One game per target word given: the trained attacker and defender."""
        words = [w.strip().lower() for w in requests]
        bad = [w for w in words if not re.fullmatch(r"[a-z][a-z-]*", w)]
        if bad:
            raise UserError(f"taboo: each request is one target word; got {bad[0]!r}")
        games = play(engine, [(w, i) for i, w in enumerate(words)], {r: r for r in ROLES}, self.config, temperature)
        return [{"word": e.word, "winner": e.winner, "why": e.why, "lines": e.lines} for e in games]

    def measure(self, iteration: int) -> list[dict]:
        """Each role against the untrained base in the other seat, on
        held-out words (iteration 0: the base against itself)."""
        if not self.config.measure_words:
            return []
        words = [(w, i) for i, w in enumerate(self.heldout[: self.config.measure_words])]
        t = self.recipe.grpo.temperature
        vs_base_def = play(self.engine, words, {"attacker": "attacker", "defender": "base"}, self.config, t)
        vs_base_att = play(self.engine, words, {"attacker": "base", "defender": "defender"}, self.config, t)
        row = {"iteration": iteration, "phase": "measure", "games": len(words),
               "attacker_win_vs_base": rates(vs_base_def)["attacker_win_rate"],
               "defender_win_vs_base": rates(vs_base_att)["defender_win_rate"],
               **rates(vs_base_def, "attacker_vs_base_"), **rates(vs_base_att, "defender_vs_base_")}
        return [{k: round(v, 6) if isinstance(v, float) else v for k, v in row.items()}]


GAME = Taboo
