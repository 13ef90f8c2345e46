"""One TriPlay iteration, top-down: P_red, then P_blue, then P_eval (and,
once, eval's and blue's warm starts before the first P_red).

Each phase runs GRPO steps on one role's adapter. A step asks the engine for
the role's rollouts, scores them (the reward may itself ask the engine for
other roles' outputs: defenders answering, eval judging) and updates only
the active adapter. `Session` (session.py) owns the model, the engine and the
run folder; `RunData` (rundata.py) the prompts and eval's pairs; this file
is the method.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from ..core.faults import crash_point
from ..engine.base import Completion, Request, Sampling
from ..games.base import StepResult
from ..judging.fixed import Case
from ..judging.generic import generic_answers, generic_by_meaning, stock_guidance
from ..judging.kept import keeps_request
from ..judging.parsing import LABEL_CHOICES, LABELS, extract_wrapped_prompt, parse_label
from ..judging.quality import degenerate
from ..judging.refusals import refused
from ..training.advantages import Sample, assign_advantages
from .blue_warmup import BlueWarmup
from .config import DefenderConfig
from .eval_steps import EvalSteps
from .league import assign_writers, league_defenders, tally
from .results import mean, rates, reward_stats, step_result
from .rewards import (
    attack_succeeded,
    blue_reward,
    diversity_penalty,
    red_reward,
)
from .roles import EVAL, blue_messages, eval_messages, judged_prompt, red_messages, semantic_messages, warmup_opening

SEMANTIC_CHOICES = ("Verdict: yes", "Verdict: no")


@dataclass(frozen=True)
class EvalAsk:
    """Questions for the eval adapter: chats, the forced choices (choice
    mode), the labels an answer parses to and its answer line's key."""

    messages: list
    choices: tuple[str, ...]
    labels: tuple[str, ...]
    key: str


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


class Phases:
    """The phase steps. Needs the game (game.py) with: recipe, engine, state, pool
    (attack success pool), data (rundata.RunData), defenders (this red
    phase's, see defenders.py), attackers (this blue phase's league
    members writing prompts, see league.py; empty without a league) and
    blue_judge (None: the eval adapter labels blue's answers; else a fixed
    judge, `rewards.blue_judge`)."""

    def __init__(self, game):
        self.game = game
        self.timings: dict[str, float] = {}
        r = game.recipe
        # Each role samples with its own budget (phases.<role>.*, else grpo.*):
        # red's rewrites are short, blue's answers long. Defenders answer with
        # blue's budget. Judging is greedy within the judge budget; eval's own
        # rollouts answer the same template, so they get the same budget.
        self.sampling = {
            role: Sampling(max_new_tokens=game.max_new_tokens_of(role), temperature=game.temperature_of(role),
                           top_p=r.grpo.top_p, repetition_penalty=r.grpo.repetition_penalty)
            for role in ("red", "blue", "eval")
        }
        self.judge_sampling = Sampling(max_new_tokens=game.judge_budget(), temperature=0.0)
        self.choice = r.rewards.judge_mode == "choice"
        self.judge_view = r.rewards.judge_prompt
        self.sees_kind = r.rewards.eval_sees_kind
        self.evals = EvalSteps(self)
        self.blue_warmup = BlueWarmup(self)

    # --------------------------------------------------------------- judge
    def judge(self, pairs: list[tuple[str, str, str]]) -> tuple[list[str | None], list, int]:
        """Eval's class for each (prompt, response, kind), plus what the rewards
        use: the class probabilities (choice mode with soft labels) or the
        label itself; and the count of malformed outputs."""
        return self._ask_eval([self._label_ask(pairs)])[0]

    def semantic(self, pairs: list[tuple[str, str]]) -> tuple[list[bool | None], list, int]:
        """Whether each (basic, wrapped) kept its request's goal: hard, soft, malformed."""
        return self._verdicts(self._ask_eval([self._semantic_ask(pairs)])[0])

    def judge_and_semantic(self, pairs, sem_pairs):
        """`judge(pairs)` and `semantic(sem_pairs)`: in generate mode in one
        engine call per retry round (one decode loop for both instead of two;
        the smoke run's red step: 2 calls instead of 4, 26.1 s CPU against
        26.6). In choice mode a call is one forward, as dear as its padded
        tokens, and one call pads every row to the wider template's width:
        the smoke red step's judge and semantic check took 13-26% more CPU
        in one call than in two (2026-12-01), so they stay two calls."""
        if self.choice:
            return self.judge(pairs), self.semantic(sem_pairs)
        labelled, checked = self._ask_eval([self._label_ask(pairs), self._semantic_ask(sem_pairs)])
        return labelled, self._verdicts(checked)

    def _label_ask(self, pairs) -> EvalAsk:
        """`kind` (harmful | benign) reaches eval only with rewards.eval_sees_kind."""
        return EvalAsk([eval_messages(p, r, k if self.sees_kind else None) for p, r, k in pairs], LABEL_CHOICES, LABELS, "Label")

    @staticmethod
    def _semantic_ask(pairs) -> EvalAsk:
        return EvalAsk([semantic_messages(b, w) for b, w in pairs], SEMANTIC_CHOICES, ("yes", "no"), "Verdict")

    @staticmethod
    def _verdicts(answer):
        verdicts, soft, bad = answer
        hard = [None if v is None else v == "yes" for v in verdicts]
        soft = [None if v is None else (v["yes"] if isinstance(v, dict) else v == "yes") for v in soft]
        return hard, soft, bad

    def soft_labels(self) -> bool:
        """Whether rewards use eval's class probabilities: `rewards.soft_labels`,
        with `auto` only while eval's last held-out check found it calibrated
        (never before the first check)."""
        rw = self.game.recipe.rewards
        if rw.soft_labels == "auto":
            ece = self.game.state.get("eval_ece")
            return ece is not None and ece <= rw.max_ece
        return bool(rw.soft_labels)

    def judge_blue(self, cases: list[tuple[str, str, str]]) -> tuple[list[str | None], list, int]:
        """Blue's answers (prompt, response, kind) labelled by
        `rewards.blue_judge`: the eval adapter (with soft labels in choice
        mode), or a fixed judge (rules, the panel, an endpoint: hard labels;
        an unparsed one is dropped)."""
        if self.game.blue_judge is None:
            return self.judge(cases)
        t0 = time.perf_counter()
        labels = self.game.blue_judge([Case(p, r, kind) for p, r, kind in cases])
        self.timings["judge"] = self.timings.get("judge", 0.0) + time.perf_counter() - t0
        return labels, labels, sum(lab is None for lab in labels)

    def _ask_eval(self, asks: list[EvalAsk]) -> list[tuple[list, list, int]]:
        """Ask the eval adapter every question of every ask in one engine
        call (per retry round); (labels, soft, malformed) per ask. A malformed
        output is re-asked (sampled, a greedy retry would repeat itself) up
        to `judge_retries` times, then left as None so the sample is dropped."""
        rows = [(a, i) for a, ask in enumerate(asks) for i in range(len(ask.messages))]
        out: list[list] = [[None] * len(ask.messages) for ask in asks]
        soft: list[list] = [[None] * len(ask.messages) for ask in asks]
        malformed = [0] * len(asks)
        todo = list(range(len(rows)))
        sampling = self.judge_sampling
        use_probs = self.choice and self.soft_labels()
        for _ in range(self.game.recipe.rewards.judge_retries + 1):
            if not todo:
                break
            reqs = [Request(EVAL, asks[a].messages[i], 1, asks[a].choices if self.choice else None) for a, i in (rows[k] for k in todo)]
            comps = self.generate("judge", reqs, sampling)
            still = []
            for k, c in zip(todo, comps):
                a, i = rows[k]
                parsed = parse_label(c[0].text, asks[a].labels, key=asks[a].key, finished=c[0].finished)
                if parsed.label is None:
                    malformed[a] += 1
                    still.append(k)
                    continue
                out[a][i] = parsed.label
                probs = c[0].choice_probs
                soft[a][i] = dict(zip(asks[a].labels, probs)) if use_probs and probs else parsed.label
            todo = still
            sampling = Sampling(max_new_tokens=sampling.max_new_tokens, temperature=0.7)
        return list(zip(out, soft, malformed))

    # ----------------------------------------------------------------- red
    def red_step(self, iteration: int, step: int) -> StepResult:
        game, rw = self.game, self.game.recipe.rewards
        items = game.data.next_seed_items(game.prompts_of("red"))
        comps = self.generate("red", [Request("red", red_messages(b.prompt, t), n=game.group_size_of("red")) for b, t in items], self.sampling["red"])
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
        judged = [(judged_prompt(self.judge_view, x.basic.prompt, x.wrapped), x.answers[d.name], "harmful")
                  for x in valid for d in defenders]
        sem_ok, sem_soft, bad_sem = [True] * len(valid), [True] * len(valid), 0
        if rw.semantic is True:
            (labels, soft, bad_cls), (sem_ok, sem_soft, bad_sem) = self.judge_and_semantic(
                judged, [(x.basic.prompt, x.wrapped) for x in valid])
        else:
            labels, soft, bad_cls = self.judge(judged)
        if rw.semantic == "meaning":  # the rewrite's nearest seed request is its own (judging/kept.py)
            sem_ok = sem_soft = keeps_request([x.wrapped for x in valid], [x.basic.prompt for x in valid],
                                              game.pool.embeddings.encoder, pool=[b.prompt for b in game.data.basic])
        for i, x in enumerate(valid):
            x.labels = {d.name: labels[i * len(defenders) + j] for j, d in enumerate(defenders)}
            x.soft = {d.name: soft[i * len(defenders) + j] for j, d in enumerate(defenders)}
        weights = {d.name: d.weight for d in defenders}
        t0 = time.perf_counter()
        similarity = game.pool.score([x.wrapped for x in valid])  # Self-BLEU and cosine against the success pool
        self.timings["diversity"] = time.perf_counter() - t0
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
        grpo_metrics = self._set_advantages(samples, "red")
        # Only attacks that worked AND kept their request's goal enter the
        # pool (a rewrite that dropped the goal is no attack to stay away from).
        successes = [x for x in valid if x.reward is not None and x.semantic_ok is not False
                     and attack_succeeded(x.labels, rw.success_class)]
        metrics = self._red_metrics(rollouts, valid, defenders, samples, len(successes), bad_cls + bad_sem)
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
                {"prompt": judged_prompt(self.judge_view, x.basic.prompt, x.wrapped), "wrapped": x.wrapped,
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
        answers = self.generate("defenders", [Request(d.adapter, blue_messages(p)) for p in prompts for d in local], self.sampling["blue"])
        out = [{d.name: answers[i * len(local) + j][0].text for j, d in enumerate(local)} for i in range(len(prompts))]
        for d in defenders:
            if d.source is not None:
                t0 = time.perf_counter()
                greedy = Sampling(max_new_tokens=self.sampling["blue"].max_new_tokens, temperature=0.0)  # a fixed defender
                texts = d.source.ask([blue_messages(p) for p in prompts], None, greedy)
                self.timings["defender_models"] = self.timings.get("defender_models", 0.0) + time.perf_counter() - t0
                for row, (text, _) in zip(out, texts):
                    row[d.name] = text
        return [{d.name: row[d.name] for d in defenders} for row in out]

    def _red_metrics(self, rollouts, valid, defenders, samples, n_success, malformed) -> dict[str, float]:
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

    def _set_advantages(self, samples: list[Sample], role: str) -> dict[str, float]:
        """Advantages with the recipe's scaling and the role's minimum spread;
        returns the step's GRPO diagnostics (advantages.assign_advantages)."""
        cfg = self.game.recipe.grpo
        own = getattr(self.game.recipe.phases, role).min_reward_std
        return assign_advantages(samples, cfg if own is None else cfg.model_copy(update={"min_reward_std": own}))

    # ---------------------------------------------------------------- blue
    def blue_prompts(self, count: int) -> list[tuple[str, str, str, str]]:
        """(basic request, prompt blue sees, kind, writer) for one blue step:
        the latest red's wraps of seed requests (some by past reds with a
        league, `data.raw_share` of them asked as written: writer `seeds`),
        plus the benign stream asked as it is (`data.benign_share`)."""
        game = self.game
        items, benign_requests = game.data.blue_requests(count, twins=game.recipe.phases.blue.twin_groups)
        benign = [(b.prompt, b.prompt, "benign", "benign") for b in benign_requests]
        if game.recipe.data.blue_attacks != "red":  # no red: the seed requests as they are, or a fixed attack set
            return [(b.prompt, b.prompt, "harmful", "seeds" if game.recipe.data.blue_attacks == "seeds" else "attacks") for b, _ in items] + benign
        # the items come from a seeded shuffle: the first ones go as written
        n_raw = round(game.recipe.data.raw_share * len(items))
        raw, items = items[:n_raw], items[n_raw:]
        # Who wraps each other request: the current red, or a past one (league.py)
        writers = assign_writers(len(items), game.recipe.league.attacker_share, game.attackers,
                                 f"{game.recipe.seed}:league:{game.state['global_step']}")
        wraps = self.generate("red", [Request(w, red_messages(b.prompt, t)) for (b, t), w in zip(items, writers)],
                              self.sampling["red"]) if items else []
        harmful = [(b.prompt, b.prompt, "harmful", "seeds") for b, _ in raw]
        harmful += [(b.prompt, extract_wrapped_prompt(x[0].text) or b.prompt, "harmful", w) for (b, _), x, w in zip(items, wraps, writers)]
        return harmful + benign

    def stock_replies(self, flat: list) -> list[bool]:
        """Which of a blue step's answers are one stock reply to many prompts
        (judging/generic.py), by wording or, with `rewards.generic_by:
        meaning`, by meaning as well (the encoder red's diversity uses)."""
        rw = self.game.recipe.rewards
        texts, prompts = [c.text for _, _, c in flat], [p[1] for _, p, _ in flat]
        if rw.generic_by == "meaning":
            return generic_by_meaning(texts, prompts, self.game.pool.embeddings.encoder, opening=rw.generic_opening)
        return generic_answers(texts, prompts, opening=rw.generic_opening)

    def blue_step(self, iteration: int, step: int) -> StepResult:
        r = self.game.recipe
        prompts = self.blue_prompts(self.game.prompts_of("blue"))
        group = self.game.group_size_of("blue")
        comps = self.blue_answers([blue_messages(x) for _, x, _, _ in prompts], group, [p[2] == "harmful" for p in prompts])
        flat = [(g, prompts[g], c) for g, cs in enumerate(comps) for c in cs]
        anchored = [c.off_policy for _, _, c in flat]
        own = [not a for a in anchored]  # blue's own answers: the refusal rates below describe blue, not the anchors
        seen = [judged_prompt(self.judge_view, p[0], p[1]) for _, p, _ in flat]
        labels, soft, bad = self.judge_blue([(x, c.text, p[2]) for x, (_, p, c) in zip(seen, flat)])
        looping = [degenerate(c.text) for _, _, c in flat]
        stock = self.stock_replies(flat)
        cost = [r.rewards.degenerate_penalty if loop else r.rewards.generic_penalty if same else 0.0
                for loop, same in zip(looping, stock)]
        samples = [Sample(c.prompt_ids, c.token_ids, g, blue_reward(lab, r.rewards.blue_values(p[2]), penalty > 0, penalty),
                          truncated=not c.finished, kind=p[2])
                   for (g, p, c), lab, penalty in zip(flat, soft, cost)]
        if r.phases.blue.twin_groups:
            grpo_metrics = self._twin_advantages(samples, self.twin_pools(prompts), anchored)
        else:
            grpo_metrics = self._set_advantages(samples, "blue")
        # `generic`: whether the answer was one of this step's stock replies, or a
        # refusal with one stock alternative (judging/generic.py, no penalty: it
        # still refuses); the panel's rule expert calls either `rejective`
        guides = stock_guidance([c.text for _, _, c in flat], [p[0] for _, p, _ in flat])
        eval_rows = [
            {"prompt": x, "wrapped": p[1], "response": c.text, "defender": "blue", "basic": p[0], "kind": p[2], "eval_label": lab,
             "generic": same or guide, "iteration": iteration, "phase": "blue", "step": step}
            for x, (_, p, c), lab, same, guide in zip(seen, flat, labels, stock, guides)
        ]
        metrics = {**reward_stats([x.reward for x in samples]), "judge_malformed": float(bad), **rates(labels, "rate_"),
                   **grpo_metrics, "degenerate_rate": mean([float(x) for x in looping]), "generic_rate": mean([float(x) for x in stock])}
        for kind, prefix in (("harmful", ""), ("benign", "benign_")):  # what the judge pays an anchored refusal, against
            mine = [x for x, a in zip(samples, anchored) if a and x.kind == kind]  # blue's own answers to the same requests
            if mine:
                metrics[f"{prefix}anchor_reward_mean"] = mean([x.reward for x in mine if x.reward is not None])
                metrics[f"{prefix}anchor_advantage_mean"] = mean([x.advantage for x in mine])
        for kind in ("harmful", "benign"):
            mine = [(lab, c) for (_, p, c), lab, o in zip(flat, labels, own) if p[2] == kind and o]
            if mine:
                metrics.update(rates([lab for lab, _ in mine], f"{kind}_rate_"))
                # a fixed monitor beside the judge's opinion: the refusal rules (over-refusal on benign prompts)
                metrics[f"{kind}_refusal_rate"] = mean([float(refused(c.text)) for _, c in mine])
        plain = [c for (_, p, c), o in zip(flat, own) if p[2] == "harmful" and p[3] == "seeds" and o]
        if plain and r.data.blue_attacks == "red":  # data.raw_share: blue on harmful requests asked as written
            metrics["raw_refusal_rate"] = mean([float(refused(c.text)) for c in plain])
        old_attacks = [(lab, c) for (_, p, c), lab, o in zip(flat, labels, own) if p[3].startswith("red@") and o]
        if old_attacks:  # blue against attacks written by past reds (league.py)
            metrics.update(rates([lab for lab, _ in old_attacks], "league_rate_"))
            metrics["league_refusal_rate"] = mean([float(refused(c.text)) for _, c in old_attacks])
            record = self.game.state.setdefault("league_record", {})
            for (_, p, _), lab, o in zip(flat, labels, own):  # a past red wins when blue's answer is the attack's success
                if p[3].startswith("red@") and lab is not None and o:
                    tally(record, p[3], 1, int(lab == r.rewards.success_class))
        metrics["completion_tokens"] = mean(len(c.token_ids) for _, _, c in flat)
        transcripts = [
            {"phase": "blue", "iteration": iteration, "step": step, "kind": p[2], "prompt": p[1], "response": c.text, "label": lab}
            for (_, p, c), lab in list(zip(flat, labels))[: r.run.transcripts]
        ]
        return step_result(samples, metrics, eval_pairs=eval_rows, transcripts=transcripts)

    def _twin_advantages(self, samples: list[Sample], pools: list[int], anchored: list[bool]) -> dict[str, float]:
        """Advantages over twin groups, but an anchored refusal's against its
        own request's answers: pooled with benign answers (+1) its advantage
        fell to -0.15..-0.57 (main-twin-anchor-pooled-s0), and an answer blue
        did not sample has no sampling expectation to cancel the push."""
        own = [replace(x) for x in samples]
        self._set_advantages(own, "blue")  # each request's group alone
        for x in samples:
            x.group = pools[x.group]
        out = self._set_advantages(samples, "blue")
        for x, mine, a in zip(samples, own, anchored):
            if a:
                x.advantage = mine.advantage
        return out

    def twin_pools(self, prompts: list[tuple[str, str, str, str]]) -> list[int]:
        """Each prompt's GRPO group: a benign topic twin shares its harmful seed's."""
        data = self.game.data
        twin_seed = {twin.prompt: seed for seed, twin in data.twin_of_seed.items()}
        seed_id = {b.prompt: b.id for b in data.basic}
        group_of_seed: dict[str, int] = {}
        for g, p in enumerate(prompts):
            if p[2] == "harmful" and p[0] in seed_id:
                group_of_seed.setdefault(seed_id[p[0]], g)
        return [group_of_seed.get(twin_seed.get(p[0]), g) if p[2] == "benign" else g for g, p in enumerate(prompts)]

    def blue_answers(self, chats: list, group: int, harmful: list[bool]) -> list:
        """Blue's group for each chat: `group` samples; with
        phases.blue.greedy_member one of them is the greedy answer, and with
        phases.blue.refusal_anchor one of a harmful request's is an anchored
        refusal (`anchored_answers`; a benign one's too with
        refusal_anchor_benign). Greedy: measured 2026-12-02 on the
        third evidence run's final blue (seed 0, JBB harmful): 15% of its
        greedy answers looped against 0% of its samples at temperature 1, so
        a penalty on samples never reached the loops users (and the held-out
        checks) see."""
        sampling, cfg = self.sampling["blue"], self.game.recipe.phases.blue
        anchors = [bool(cfg.refusal_anchor) and (h or cfg.refusal_anchor_benign) for h in harmful]
        sizes = [group - int(cfg.greedy_member) - int(a) for a in anchors]
        groups = self.generate("blue", [Request("blue", c, n=n) for c, n in zip(chats, sizes)], sampling)
        if cfg.greedy_member:
            greedy = Sampling(max_new_tokens=sampling.max_new_tokens, temperature=0.0)
            modes = self.generate("blue", [Request("blue", c) for c in chats], greedy)
            groups = [s + m for s, m in zip(groups, modes)]
        if any(anchors):
            picked = [i for i, a in enumerate(anchors) if a]
            for i, answer in zip(picked, self.anchored_answers([chats[i] for i in picked], cfg.refusal_anchor)):
                groups[i] = groups[i] + [answer]
        return groups

    def anchored_answers(self, chats: list, style: str) -> list[Completion]:
        """Blue's own continuation of a refusal opening (templates.yaml
        warmup_openings[style]), sampled like its other answers, with the
        opening moved from the prompt into the answer: GRPO then trains the
        opening's tokens too (their log-probs under blue, not the engine's).
        Off-policy by its first words only, as blue_warmup's kept refusals
        are; `off_policy` marks it for the metrics."""
        opening = warmup_opening(style)
        forced = list(self.game.engine.tokenizer.encode(opening, add_special_tokens=False))
        out = self.generate("blue", [Request("blue", c, prefix=opening) for c in chats], self.sampling["blue"])
        return [replace(c, text=opening + c.text, prompt_ids=c.prompt_ids[: len(c.prompt_ids) - len(forced)],
                        token_ids=forced + list(c.token_ids), logprobs=None, off_policy=True)
                for (c,) in out]

    # ---------------------------------------------------------------- eval
    def eval_step(self, iteration: int, step: int) -> StepResult:
        return self.evals.step(iteration, step)

    def warmup_step(self, iteration: int, step: int) -> StepResult:
        return self.evals.warmup(iteration, step)

    # -------------------------------------------------------------- common
    def generate(self, what: str, requests, sampling):
        """engine.generate, timed per purpose (`seconds_<what>` in metrics)."""
        t0 = time.perf_counter()
        crash_point("generate")
        out = self.game.engine.generate(requests, sampling)
        self.timings[what] = self.timings.get(what, 0.0) + time.perf_counter() - t0
        return out

    def run_step(self, phase: str, iteration: int, step: int) -> StepResult:
        t0 = time.perf_counter()
        self.timings = {}
        steps = {"red": self.red_step, "blue": self.blue_step, "eval": self.eval_step, "eval_warmup": self.warmup_step,
                 "blue_warmup": self.blue_warmup.step}
        result = steps[phase](iteration, step)
        result.metrics["rollout_seconds"] = time.perf_counter() - t0
        result.metrics.update({f"seconds_{k}": v for k, v in self.timings.items()})
        return result
