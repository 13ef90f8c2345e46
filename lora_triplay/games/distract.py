"""Distraction self-play (after Seirênes, arXiv 2605.11636) as two LoRA roles.

An adversary writes one plausible but irrelevant sentence for a problem
with an exact answer; the reasoner solves the clean problem and the
distracted one (the sentence inserted before the question). The
adversary's reward is p(clean) - p(distracted), both estimated from the
reasoner's `samples` answers: bounded, and zero once the reasoner is
robust or the problem is out of reach (self-throttling). The reasoner is
trained with GRPO on clean and on distracted problems (groups of its
`samples` answers, reward 1 for the exact answer), the adversary
REINFORCE-style with a per-problem baseline (its rewards centred over the
`group_size` sentences it wrote for the same problem); groups whose
rewards are all equal carry no signal and are dropped (Seirênes' filter).

Problems: arithmetic word problems made by our own code at difficulty 1-3
from a seed (games/distract.py: `make_problem`), or a user file of
question/answer rows. After each iteration, held-out problems measure the
reasoner's clean and distracted accuracy (`phase: measure`).
"""
from __future__ import annotations

import csv
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ..engine.base import Request, Sampling
from ..errors import UserError
from ..training.advantages import Sample, group_advantages
from .base import Game, StepResult

REASONER = "Solve the math word problem. Think briefly, then end with a line: Answer: <number>"
ADVERSARY = ("You write one extra sentence for a math word problem: a plausible detail, with a number if you like, "
             "that does not change the answer. Reply with the sentence only.")
NAMES = ("Mia", "Leo", "Ava", "Noah", "Zoe", "Omar", "Iris", "Ben", "Lena", "Sam")
THINGS = ("apples", "stickers", "marbles", "books", "coins", "shells", "pencils", "cookies", "stamps", "cards")


class DistractConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    adversary_steps: int = Field(2, ge=0)
    reasoner_steps: int = Field(2, ge=0)
    problems_per_step: int = Field(4, ge=1)
    group_size: int = Field(4, ge=2, description="adversary sentences per problem (its REINFORCE baseline group)")
    samples: int = Field(4, ge=2, description="reasoner answers per problem: its GRPO group, and the p(correct) estimate")
    difficulty: list[int] = Field(default_factory=lambda: [1, 2], description="generated problems: 1 (one step) to 3")
    problems: str = Field("generated", description="generated, or a CSV/JSONL file with question and answer columns")
    max_new_tokens: int = Field(48, ge=8, description="the reasoner's answers")
    distraction_tokens: int = Field(32, ge=4, description="the adversary's sentence")
    heldout: int = Field(24, ge=0, description="held-out problems measured after each iteration (0: none)")


@dataclass
class Problem:
    context: str  # the story before the question
    question: str
    answer: int

    def text(self, distraction: str = "") -> str:
        return " ".join(x for x in (self.context, distraction, self.question) if x)


def make_problem(rng: random.Random, difficulty: int) -> Problem:
    """A word problem with an exact integer answer, 1 to 3 steps."""
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    a, b, c, k = rng.randint(2, 20), rng.randint(2, 20), rng.randint(1, 9), rng.randint(2, 4)
    if difficulty == 1:
        return Problem(f"{name} has {a} {thing}. A friend gives {name} {b} more.", f"How many {thing} does {name} have now?", a + b)
    if difficulty == 2:
        c = min(c, a + b - 1)
        return Problem(f"{name} has {a} {thing}, buys {b} more and then gives {c} away.", f"How many {thing} are left?", a + b - c)
    return Problem(f"{name} has {k} boxes with {a} {thing} in each, and gives {c} {thing} away.", f"How many {thing} remain?", k * a - c)


def load_problems(spec: str) -> list[Problem]:
    path = Path(spec).expanduser()
    if not path.is_file():
        raise UserError(f"game_config.problems = {spec!r}: no such file; give a CSV or JSONL with question and answer, or generated")
    if path.suffix == ".jsonl":
        rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    else:
        rows = list(csv.DictReader(path.open(encoding="utf-8")))
    out = []
    for i, row in enumerate(rows, 1):
        try:
            out.append(Problem("", str(row["question"]).strip(), int(str(row["answer"]).strip())))
        except (KeyError, ValueError):
            raise UserError(f"{path}: row {i} needs a question and an integer answer") from None
    if len(out) < 2:
        raise UserError(f"{path}: need at least 2 problems, got {len(out)}")
    return out


ANSWER = re.compile(r"answer\s*[:=]?\s*(-?\d[\d,]*)", re.I)
NUMBER = re.compile(r"-?\d[\d,]*")


def extract_answer(text: str) -> int | None:
    """The number after `Answer:`, else the last number in the text."""
    m = ANSWER.findall(text) or NUMBER.findall(text)
    if not m:
        return None
    try:
        return int(m[-1].replace(",", ""))
    except ValueError:
        return None


def clean_distraction(text: str) -> str:
    """One sentence, no question (a question would change the task)."""
    line = text.strip().split("\n")[0].strip().strip('"')
    line = re.split(r"(?<=[.!])\s", line)[0][:200]
    return "" if "?" in line else line


class Distract(Game):
    name = "distract"
    roles = {"adversary": "adversary", "reasoner": "reasoner"}
    jsonl = ("problems",)
    Config = DistractConfig
    headline = {
        "adversary": ("reward_mean", "clean_accuracy", "distracted_accuracy", "valid_distraction_rate", "entropy"),
        "reasoner": ("reward_mean", "clean_accuracy", "distracted_accuracy", "kept_groups", "entropy"),
        "measure": ("clean_accuracy", "distracted_accuracy"),
    }

    def __init__(self, recipe):
        super().__init__(recipe)
        cfg = self.config
        if any(d not in (1, 2, 3) for d in cfg.difficulty) or not cfg.difficulty:
            raise UserError(f"game_config.difficulty = {cfg.difficulty}: use levels from 1 to 3")
        self.pool = None if cfg.problems == "generated" else load_problems(cfg.problems)
        rng = random.Random(f"{recipe.seed}:distract:heldout")
        if self.pool is not None:
            rng.shuffle(self.pool)
            self.heldout, self.pool = self.pool[: cfg.heldout], self.pool[cfg.heldout:] or self.pool
        else:
            self.heldout = [make_problem(rng, cfg.difficulty[i % len(cfg.difficulty)]) for i in range(cfg.heldout)]
        self._held = {p.text() for p in self.heldout}

    def max_new_tokens_of(self, role: str) -> int:
        return self.config.distraction_tokens if role == "adversary" else self.config.max_new_tokens

    # ------------------------------------------------------------- pieces
    def _problems(self, n: int) -> list[Problem]:
        rng = random.Random(f"{self.recipe.seed}:distract:{self.state['global_step']}")  # a redone step draws the same
        if self.pool is not None:
            return rng.sample(self.pool, min(n, len(self.pool)))
        out: list[Problem] = []
        while len(out) < n:
            p = make_problem(rng, rng.choice(self.config.difficulty))
            if p.text() not in self._held:
                out.append(p)
        return out

    def _distract(self, problems: list[Problem], adapter: str, n: int) -> list[list]:
        reqs = [Request(adapter, [{"role": "system", "content": ADVERSARY}, {"role": "user", "content": f"Problem: {p.text()}"}], n=n)
                for p in problems]
        return self.engine.generate(reqs, Sampling(max_new_tokens=self.config.distraction_tokens, temperature=self.recipe.grpo.temperature))

    def _solve(self, texts: list[str], adapter: str) -> list[list]:
        reqs = [Request(adapter, [{"role": "system", "content": REASONER}, {"role": "user", "content": t}], n=self.config.samples)
                for t in texts]
        return self.engine.generate(reqs, Sampling(max_new_tokens=self.config.max_new_tokens, temperature=self.recipe.grpo.temperature))

    @staticmethod
    def _correct(comps, answer: int) -> list[float]:
        return [float(extract_answer(c.text) == answer) for c in comps]

    # -------------------------------------------------------------- steps
    def step(self, phase: str, iteration: int, step: int) -> StepResult:
        cfg = self.config
        problems = self._problems(cfg.problems_per_step)
        if phase == "adversary":
            sents = self._distract(problems, "adversary", cfg.group_size)
            flat = [(i, c, clean_distraction(c.text)) for i, cs in enumerate(sents) for c in cs]
            answers = self._solve([p.text() for p in problems] + [problems[i].text(d) for i, _, d in flat], "reasoner")
            p_clean = [sum(self._correct(a, p.answer)) / cfg.samples for a, p in zip(answers, problems)]
            p_dist = [sum(self._correct(a, problems[i].answer)) / cfg.samples for (i, _, _), a in zip(flat, answers[len(problems):])]
            rewards = [p_clean[i] - pd if d else -1.0 for (i, _, d), pd in zip(flat, p_dist)]  # no sentence: the worst
            adv = group_advantages(rewards, [i for i, _, _ in flat], scale=False)  # REINFORCE, per-problem baseline
            samples = [Sample(c.prompt_ids, c.token_ids, i, r, advantage=a) for (i, c, _), r, a in zip(flat, rewards, adv)]
            metrics = {"reward_mean": sum(rewards) / len(rewards), "clean_accuracy": sum(p_clean) / len(p_clean),
                       "distracted_accuracy": sum(p_dist) / len(p_dist), "valid_distraction_rate": sum(bool(d) for _, _, d in flat) / len(flat)}
            rows = [{"iteration": iteration, "phase": phase, "step": step, "problem": problems[i].text(), "answer": problems[i].answer,
                     "distraction": d, "reward": r} for (i, _, d), r in zip(flat, rewards)]
            return StepResult(samples, metrics, {"problems": rows})
        # the reasoner: clean and distracted versions (sentences by the current adversary)
        sents = self._distract(problems, "adversary", 1)
        distractions = [clean_distraction(cs[0].text) for cs in sents]
        texts = [p.text() for p in problems] + [p.text(d) for p, d in zip(problems, distractions)]
        truth = [p.answer for p in problems] * 2
        answers = self._solve(texts, "reasoner")
        samples, kept, acc = [], 0, []
        for g, (comps, ans) in enumerate(zip(answers, truth)):
            rewards = self._correct(comps, ans)
            acc.append(sum(rewards) / len(rewards))
            if len(set(rewards)) < 2:
                continue  # every answer equally right or wrong: no signal (filtered)
            kept += 1
            adv = group_advantages(rewards, [g] * len(rewards), self.recipe.grpo.scale_rewards)
            samples += [Sample(c.prompt_ids, c.token_ids, g, r, advantage=a) for c, r, a in zip(comps, rewards, adv)]
        n = len(problems)
        metrics = {"reward_mean": sum(acc) / len(acc), "clean_accuracy": sum(acc[:n]) / n, "distracted_accuracy": sum(acc[n:]) / n,
                   "kept_groups": float(kept)}
        rows = [{"iteration": iteration, "phase": phase, "step": step, "problem": t, "answer": a, "accuracy": x}
                for t, a, x in zip(texts, truth, acc)]
        return StepResult(samples, metrics, {"problems": rows})

    # ---------------------------------------------------------- inference
    def play(self, engine, requests: list[str], temperature: float) -> list[dict]:
        """Each request `QUESTION = ANSWER` (or a question alone): the
        adversary's sentence, and the reasoner on both versions."""
        problems = []
        for text in requests:
            q, _, a = text.rpartition("=") if "=" in text else (text, "", "")
            problems.append(Problem("", q.strip(), int(a) if a.strip().lstrip("-").isdigit() else None))
        sents = [clean_distraction(cs[0].text) for cs in self._distract(problems, "adversary", 1)]
        answers = self._solve([p.text() for p in problems] + [p.text(d) for p, d in zip(problems, sents)], "reasoner")
        n = len(problems)
        return [{"problem": p.text(), "answer": p.answer, "distraction": d, "clean": a[0].text, "distracted": b[0].text,
                 "clean_correct": extract_answer(a[0].text) == p.answer if p.answer is not None else None,
                 "distracted_correct": extract_answer(b[0].text) == p.answer if p.answer is not None else None}
                for p, d, a, b in zip(problems, sents, answers[:n], answers[n:])]

    # ---------------------------------------------------------- measuring
    def measure(self, iteration: int) -> list[dict]:
        """The reasoner's accuracy on held-out problems, clean and with the
        current adversary's sentences (sampled, seeded from the run's RNG)."""
        if not self.heldout:
            return []
        distractions = [clean_distraction(cs[0].text) for cs in self._distract(self.heldout, "adversary", 1)]
        answers = self._solve([p.text() for p in self.heldout] + [p.text(d) for p, d in zip(self.heldout, distractions)], "reasoner")
        acc = [sum(self._correct(a, p.answer)) / self.config.samples for a, p in zip(answers, self.heldout * 2)]
        n = len(self.heldout)
        return [{"iteration": iteration, "phase": "measure", "problems": n,
                 "clean_accuracy": round(sum(acc[:n]) / n, 6), "distracted_accuracy": round(sum(acc[n:]) / n, 6)}]


GAME = Distract
