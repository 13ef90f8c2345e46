"""Red's step (P_red): red rewrites seed requests, every defender answers,
eval judges each answer and checks that the rewrite kept its request, and
red's reward is the defenders' weighted failure minus its diversity penalty
against the attack success pool (rewards/red.py). Successful attacks that
kept their goal join the pool; every answered pair goes to eval's data.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..engine.base import Request, Sampling
from ..games.base import StepResult
from ..judging.generic import stock_guidance
from ..judging.kept import keeps_request
from ..judging.parsing import extract_wrapped_prompt
from ..training.advantages import Sample
from .config import DefenderConfig
from .league import league_defenders, tally
from .results import mean, rates, reward_stats, step_result
from .rewards import attack_succeeded, diversity_penalty, red_reward
from .roles import blue_messages, judged_prompt, red_messages


@dataclass
class RedRollout:
    """One of red's completions and everything its reward is made of."""

    group: int
    basic: object  # roles.BasicPrompt
    technique: object  # roles.Technique
    completion: object  # engine Completion
    wrapped: str | None  # the adversarial prompt extracted from the completion
    answers: dict[str, str] = field(default_factory=dict)  # defender -> answer
    labels: dict[str, str | None] = field(default_factory=dict)  # defender -> eval's class
    soft: dict[str, object] = field(default_factory=dict)  # what the reward uses (label or probabilities)
    semantic_ok: bool | None = None
    reward: float | None = None
    subs: dict[str, float] = field(default_factory=dict)


class RedSteps:
    """Needs the phases object (loop.Phases): its game, engine calls,
    samplings, eval's judging and the advantages."""

    def __init__(self, phases):
        self.p = phases

    @property
    def game(self):
        return self.p.game

    def step(self, iteration: int, step: int) -> StepResult:
        game, rw = self.game, self.game.recipe.rewards
        items = game.data.next_seed_items(game.prompts_of("red"))
        comps = self.p.generate("red", [Request("red", red_messages(b.prompt, t), n=game.group_size_of("red")) for b, t in items],
                                self.p.sampling["red"])
        rollouts = [
            RedRollout(group, basic, technique, c, extract_wrapped_prompt(c.text))
            for group, ((basic, technique), cs) in enumerate(zip(items, comps)) for c in cs
        ]
        valid = [x for x in rollouts if x.wrapped]
        defenders = game.defenders
        for x, answers in zip(valid, self.defend(defenders, [x.wrapped for x in valid])):
            x.answers = answers
        # Every defender's answer judged and every rewrite's goal checked
        # (both ask the eval adapter, neither needs the other's result).
        judged = [(judged_prompt(self.p.judge_view, x.basic.prompt, x.wrapped), x.answers[d.name], "harmful")
                  for x in valid for d in defenders]
        sem_ok, sem_soft, bad_sem = [True] * len(valid), [True] * len(valid), 0
        if rw.semantic is True:
            (labels, soft, bad_cls), (sem_ok, sem_soft, bad_sem) = self.p.judge_and_semantic(
                judged, [(x.basic.prompt, x.wrapped) for x in valid])
        else:
            labels, soft, bad_cls = self.p.judge(judged)
        if rw.semantic == "meaning":  # the rewrite's nearest seed request is its own (judging/kept.py)
            sem_ok = sem_soft = keeps_request([x.wrapped for x in valid], [x.basic.prompt for x in valid],
                                              game.pool.embeddings.encoder, pool=[b.prompt for b in game.data.basic])
        for i, x in enumerate(valid):
            x.labels = {d.name: labels[i * len(defenders) + j] for j, d in enumerate(defenders)}
            x.soft = {d.name: soft[i * len(defenders) + j] for j, d in enumerate(defenders)}
        weights = {d.name: d.weight for d in defenders}
        t0 = time.perf_counter()
        similarity = game.pool.score([x.wrapped for x in valid])  # Self-BLEU and cosine against the success pool
        self.p.timings["diversity"] = time.perf_counter() - t0
        for x, ok, p_ok, (s_bleu, s_cos) in zip(valid, sem_ok, sem_soft, similarity):
            x.semantic_ok = ok
            x.reward, x.subs = red_reward(
                x.soft, weights, rw.red_class_values, p_ok, rw.semantic_value if rw.semantic else 0.0,
                s_bleu, s_cos, rw.w_bleu, rw.w_cos, rw.k, gate=rw.semantic_gate,
            )
        # An empty or unparseable rewrite is red's own failure: worst penalty, no attack credit.
        worst = -diversity_penalty(1.0, 1.0, rw.w_bleu, rw.w_cos, rw.k)
        samples = [Sample(x.completion.prompt_ids, x.completion.token_ids, x.group, x.reward if x.wrapped else worst,
                          truncated=not x.completion.finished) for x in rollouts]
        grpo_metrics = self.p._set_advantages(samples, "red")
        # Only attacks that worked AND kept their request's goal enter the
        # pool (a rewrite that dropped the goal is no attack to stay away from).
        successes = [x for x in valid if x.reward is not None and x.semantic_ok is not False
                     and attack_succeeded(x.labels, rw.success_class)]
        metrics = self._metrics(rollouts, valid, defenders, samples, len(successes), bad_cls + bad_sem)
        metrics.update(rates(labels, "judge_rate_"), **grpo_metrics)
        if self.game.recipe.league.size:  # past blues' games for league.sampling=winrate: a member wins when red fails
            for d in defenders:
                if d.adapter.startswith("blue@"):
                    judged = [x.labels[d.name] for x in valid if x.labels[d.name] is not None]
                    tally(self.game.state.setdefault("league_record", {}), d.adapter, len(judged), sum(c != rw.success_class for c in judged))
        answered = [(x, d) for x in valid for d in defenders]
        # `generic`: a refusal whose alternative this step's defenders offered to many requests (judging/generic.py)
        stock = stock_guidance([x.answers[d.name] for x, d in answered], [x.basic.prompt for x, _ in answered])
        return step_result(
            samples, metrics,
            asp=[{"text": x.wrapped, "basic": x.basic.prompt, "technique": x.technique.name, "iteration": iteration, "step": step}
                 for x in successes],
            eval_pairs=[
                # `prompt` is what eval read (rewards.judge_prompt), so the
                # panel labels and eval learns the pair as it is judged
                {"prompt": judged_prompt(self.p.judge_view, x.basic.prompt, x.wrapped), "wrapped": x.wrapped,
                 "response": x.answers[d.name], "defender": d.name, "basic": x.basic.prompt, "kind": "harmful",
                 "eval_label": x.labels[d.name], "generic": same, "iteration": iteration, "phase": "red", "step": step}
                for (x, d), same in zip(answered, stock)
            ],
            transcripts=[
                {"phase": "red", "iteration": iteration, "step": step, "basic": x.basic.prompt, "technique": x.technique.name,
                 "wrapped": x.wrapped, "answers": x.answers, "labels": x.labels, "reward": x.reward}
                for x in valid[: game.recipe.run.transcripts]
            ],
        )

    def defend(self, defenders, prompts: list[str]) -> list[dict[str, str]]:
        """Every defender's answer to every prompt ({name: answer} per prompt):
        the adapters in one mixed-adapter batch, each model defender
        (another model family) through its own source."""
        local = [d for d in defenders if d.source is None]
        answers = self.p.generate("defenders", [Request(d.adapter, blue_messages(p)) for p in prompts for d in local], self.p.sampling["blue"])
        out = [{d.name: answers[i * len(local) + j][0].text for j, d in enumerate(local)} for i in range(len(prompts))]
        for d in defenders:
            if d.source is not None:
                t0 = time.perf_counter()
                greedy = Sampling(max_new_tokens=self.p.sampling["blue"].max_new_tokens, temperature=0.0)  # a fixed defender
                texts = d.source.ask([blue_messages(p) for p in prompts], None, greedy)
                self.p.timings["defender_models"] = self.p.timings.get("defender_models", 0.0) + time.perf_counter() - t0
                for row, (text, _) in zip(out, texts):
                    row[d.name] = text
        return [{d.name: row[d.name] for d in defenders} for row in out]

    def _metrics(self, rollouts, valid, defenders, samples, n_success, malformed) -> dict[str, float]:
        subs = [x.subs for x in valid]
        metrics = {
            **reward_stats([x.reward for x in samples]),
            "valid_rewrite_rate": len(valid) / max(len(rollouts), 1),
            "diversity_penalty": mean(x.get("diversity_penalty") for x in subs),
            "s_bleu": mean(x.get("s_bleu") for x in subs),
            "s_cos": mean(x.get("s_cos") for x in subs),
            "defender_gaps": float(sum(x.get("defender_gaps", 0.0) for x in subs)),
            "judge_malformed": float(malformed),
            "asp_size": float(len(self.game.pool) + n_success),
            "defenders": float(len(defenders)),
            "completion_tokens": mean(len(x.completion.token_ids) for x in rollouts),
        }
        if self.game.recipe.rewards.semantic:  # with no check every rewrite "passes": a 1.0 that would read as a verdict
            metrics["semantic_pass_rate"] = mean([float(x.semantic_ok) for x in valid if x.semantic_ok is not None])
        success = self.game.recipe.rewards.success_class
        for d in defenders:
            judged = [x.labels[d.name] for x in valid if x.labels[d.name] is not None]
            metrics[f"asr_{d.name}"] = mean([float(c == success) for c in judged])
        members = {d.name for d in league_defenders(self.game.recipe.league, DefenderConfig)} & {d.name for d in defenders}
        if members:  # red against the past blues (league.py), pooled
            judged = [x.labels[n] for x in valid for n in members if x.labels[n] is not None]
            metrics["asr_league"] = mean([float(c == success) for c in judged])
        return metrics
