"""One TriPlay iteration, top-down: P_red, then P_blue, then P_eval (and,
once, eval's and blue's warm starts before the first P_red).

Each phase runs GRPO steps on one role's adapter. A step asks the engine for
the role's rollouts, scores them (the reward may itself ask the engine for
other roles' outputs: defenders answering, eval judging) and updates only
the active adapter. `Session` (session.py) owns the model, the engine and the
run folder; `RunData` (rundata.py) the prompts and eval's pairs; this file
is the method: eval's judging and blue's step here, red's step in
red_steps.py, eval's steps in eval_steps.py, blue's warm start in
blue_warmup.py.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

from ..core.faults import crash_point
from ..engine.base import Completion, Request, Sampling
from ..games.base import StepResult
from ..judging.fixed import Case
from ..judging.generic import generic_answers, generic_by_meaning, stock_guidance
from ..judging.parsing import LABEL_CHOICES, LABELS, extract_wrapped_prompt, parse_label
from ..judging.quality import degenerate
from ..judging.refusals import refused
from ..training.advantages import Sample, assign_advantages
from .blue_warmup import BlueWarmup
from .eval_steps import EvalSteps
from .league import assign_writers, tally
from .red_steps import RedSteps
from .results import mean, rates, reward_stats, step_result
from .rewards import blue_reward
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
        self.reds = RedSteps(self)
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
        return self.reds.step(iteration, step)

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
