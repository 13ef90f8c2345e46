"""One TriPlay iteration, top-down: P_red, then P_blue, then P_eval.

Each phase runs GRPO steps on one role's adapter. A step asks the engine for
the role's rollouts, scores them (the reward may itself ask the engine for
other roles' outputs: defenders answering, eval judging) and updates only
the active adapter. `Session` (session.py) owns the model, the engine and the
run folder; this file is the method.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from .engine.base import Request, Sampling
from .faults import crash_point
from .grpo import Sample, group_advantages
from .judge import extract_wrapped_prompt, parse_label, parse_verdict
from .rewards import attack_succeeded, blue_reward, diversity_penalty, eval_reward, red_reward
from .roles import blue_messages, eval_messages, red_messages, semantic_messages

LABELS = ("negative", "rejective", "positive")
LABEL_CHOICES = tuple(f"Label: {c}" for c in LABELS)
SEMANTIC_CHOICES = ("Verdict: yes", "Verdict: no")


@dataclass
class StepResult:
    """What a phase step hands back to the session for GRPO and storage."""

    samples: list[Sample]
    metrics: dict[str, float]
    asp_rows: list[dict] = field(default_factory=list)
    eval_rows: list[dict] = field(default_factory=list)
    panel_rows: list[dict] = field(default_factory=list)
    transcripts: list[dict] = field(default_factory=list)


def _mean(xs) -> float:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else 0.0


def _reward_stats(rewards: list[float | None]) -> dict[str, float]:
    kept = [r for r in rewards if r is not None]
    return {
        "reward_mean": _mean(kept),
        "reward_std": statistics.pstdev(kept) if len(kept) > 1 else 0.0,
        "dropped": float(len(rewards) - len(kept)),
    }


class Phases:
    """The three phase steps. Needs a session with: recipe, engine, pool
    (attack success pool), panel, next_seed_items(k), label_new_pairs(k),
    sample_labelled_pairs(k)."""

    def __init__(self, session):
        self.s = session
        self.timings: dict[str, float] = {}
        r = session.recipe
        self.policy = Sampling(
            max_new_tokens=r.grpo.max_new_tokens,
            temperature=r.grpo.temperature,
            top_p=r.grpo.top_p,
            repetition_penalty=r.grpo.repetition_penalty,
        )
        self.judge_sampling = Sampling(max_new_tokens=r.rewards.judge_max_new_tokens, temperature=0.0)
        self.choice = r.rewards.judge_mode == "choice"

    # --------------------------------------------------------------- judge
    def judge(self, pairs: list[tuple[str, str]]) -> tuple[list[str | None], list, int]:
        """Eval's class for each (prompt, response), plus what the rewards
        use: the class probabilities (choice mode with soft labels) or the
        label itself; and the count of malformed outputs."""
        return self._ask_eval([eval_messages(p, r) for p, r in pairs], LABEL_CHOICES, LABELS, "Label")

    def semantic(self, pairs: list[tuple[str, str]]) -> tuple[list[bool | None], list, int]:
        verdicts, soft, bad = self._ask_eval([semantic_messages(b, w) for b, w in pairs], SEMANTIC_CHOICES, ("yes", "no"), "Verdict")
        hard = [None if v is None else v == "yes" for v in verdicts]
        soft = [None if v is None else (v["yes"] if isinstance(v, dict) else v == "yes") for v in soft]
        return hard, soft, bad

    def _ask_eval(self, messages, choices, labels, key):
        """Ask the eval adapter; a malformed output is re-asked (sampled, a
        greedy retry would repeat itself) up to `judge_retries` times, then
        left as None so the sample is dropped."""
        out: list[str | None] = [None] * len(messages)
        soft: list = [None] * len(messages)
        malformed = 0
        todo = list(range(len(messages)))
        sampling = self.judge_sampling
        use_probs = self.choice and self.s.recipe.rewards.soft_labels
        for _ in range(self.s.recipe.rewards.judge_retries + 1):
            if not todo:
                break
            reqs = [Request("eval", messages[i], 1, choices if self.choice else None) for i in todo]
            comps = self.generate("judge", reqs, sampling)
            still = []
            for i, c in zip(todo, comps):
                parsed = parse_label(c[0].text, labels, key=key, finished=c[0].finished)
                if parsed.label is None:
                    malformed += 1
                    still.append(i)
                    continue
                out[i] = parsed.label
                probs = c[0].choice_probs
                soft[i] = dict(zip(labels, probs)) if use_probs and probs else parsed.label
            todo = still
            sampling = Sampling(max_new_tokens=sampling.max_new_tokens, temperature=0.7)
        return out, soft, malformed

    # ----------------------------------------------------------------- red
    def red_step(self, iteration: int, step: int) -> StepResult:
        s, r = self.s, self.s.recipe
        G = r.grpo.group_size
        items = s.next_seed_items(r.grpo.prompts_per_step)
        comps = self.generate("red", [Request("red", red_messages(b.prompt, t), n=G) for b, t in items], self.policy)
        rollouts = [(g, b, t, c, extract_wrapped_prompt(c.text)) for g, ((b, t), cs) in enumerate(zip(items, comps)) for c in cs]
        valid = [x for x in rollouts if x[4]]
        defenders = [d for d in r.defenders if d.name in s.available_defenders()]
        # Every defender answers every wrapped prompt: one mixed-adapter batch.
        answers = self.generate("defenders", [Request(d.name, blue_messages(x[4])) for x in valid for d in defenders], self.policy)
        answer_text = [a[0].text for a in answers]
        pairs = [(x[4], answer_text[i * len(defenders) + j]) for i, x in enumerate(valid) for j in range(len(defenders))]
        classes, class_soft, bad_cls = self.judge(pairs)
        if r.rewards.semantic:
            sem_ok, sem_soft, bad_sem = self.semantic([(x[1].prompt, x[4]) for x in valid])
        else:
            sem_ok, sem_soft, bad_sem = [True] * len(valid), [True] * len(valid), 0
        scores = s.pool.score([x[4] for x in valid])
        weights = {d.name: d.weight for d in defenders}
        rewards: dict[int, float | None] = {}
        subs: dict[int, dict] = {}
        successes, eval_rows, hits = [], [], {d.name: [] for d in defenders}
        for i, x in enumerate(valid):
            cls = {d.name: classes[i * len(defenders) + j] for j, d in enumerate(defenders)}
            cls_soft = {d.name: class_soft[i * len(defenders) + j] for j, d in enumerate(defenders)}
            s_bleu, s_cos = scores[i]
            reward, sub = red_reward(
                cls_soft, weights, r.rewards.red_class_values, sem_soft[i],
                r.rewards.semantic_value if r.rewards.semantic else 0.0, s_bleu, s_cos,
                r.rewards.w_bleu, r.rewards.w_cos, r.rewards.k,
            )
            rewards[id(x)], subs[id(x)] = reward, sub
            for name, c in cls.items():
                if c is not None:
                    hits[name].append(c == r.rewards.success_class)
            if reward is not None and attack_succeeded(cls, r.rewards.success_class):
                successes.append({"text": x[4], "basic": x[1].prompt, "technique": x[2].name, "iteration": iteration, "step": step})
            for j, d in enumerate(defenders):
                eval_rows.append({
                    "prompt": x[4], "response": pairs[i * len(defenders) + j][1], "defender": d.name,
                    "basic": x[1].prompt, "eval_label": cls[d.name], "iteration": iteration, "phase": "red", "step": step,
                })
        # An empty or unparseable rewrite is red's own failure: worst penalty, no attack credit.
        worst = -diversity_penalty(1.0, 1.0, r.rewards.w_bleu, r.rewards.w_cos, r.rewards.k)
        samples = []
        for x in rollouts:
            group, _, _, comp, wrapped = x
            samples.append(Sample(comp.prompt_ids, comp.token_ids, group, rewards[id(x)] if wrapped else worst))
        reward_list = [smp.reward for smp in samples]
        for smp, adv in zip(samples, group_advantages(reward_list, [smp.group for smp in samples], r.grpo.scale_rewards)):
            smp.advantage = adv
        sub_rows = list(subs.values())
        metrics = {
            **_reward_stats(reward_list),
            "valid_rewrite_rate": len(valid) / max(len(rollouts), 1),
            "semantic_pass_rate": _mean([float(v) for v in sem_ok if v is not None]) if valid else 0.0,
            "diversity_penalty": _mean(x.get("diversity_penalty") for x in sub_rows),
            "s_bleu": _mean(x.get("s_bleu") for x in sub_rows),
            "s_cos": _mean(x.get("s_cos") for x in sub_rows),
            "judge_malformed": float(bad_cls + bad_sem),
            "asp_size": float(len(s.pool) + len(successes)),
            "completion_tokens": _mean(len(c.token_ids) for x in rollouts for c in [x[3]]),
        }
        for name, h in hits.items():
            metrics[f"asr_{name}"] = _mean([float(v) for v in h])
        transcripts = [
            {"phase": "red", "iteration": iteration, "step": step, "basic": x[1].prompt, "technique": x[2].name,
             "wrapped": x[4], "reward": rewards.get(id(x))}
            for x in valid[: r.run.transcripts]
        ]
        return StepResult(samples, metrics, successes, eval_rows, transcripts=transcripts)

    # ---------------------------------------------------------------- blue
    def blue_step(self, iteration: int, step: int) -> StepResult:
        s, r = self.s, self.s.recipe
        G = r.grpo.group_size
        items = s.next_seed_items(r.grpo.prompts_per_step)
        # Blue trains on prompts written by the latest red.
        wraps = self.generate("red", [Request("red", red_messages(b.prompt, t)) for b, t in items], self.policy)
        prompts = [(b, extract_wrapped_prompt(w[0].text) or b.prompt) for (b, _), w in zip(items, wraps)]
        comps = self.generate("blue", [Request("blue", blue_messages(x), n=G) for _, x in prompts], self.policy)
        flat = [(g, prompts[g], c) for g, cs in enumerate(comps) for c in cs]
        labels, soft, bad = self.judge([(p[1], c.text) for _, p, c in flat])
        values = r.rewards.blue_class_values
        samples = [Sample(c.prompt_ids, c.token_ids, g, blue_reward(lab, values)) for (g, _, c), lab in zip(flat, soft)]
        for smp, adv in zip(samples, group_advantages([x.reward for x in samples], [x.group for x in samples], r.grpo.scale_rewards)):
            smp.advantage = adv
        eval_rows = [
            {"prompt": p[1], "response": c.text, "defender": "blue", "basic": p[0].prompt, "eval_label": lab,
             "iteration": iteration, "phase": "blue", "step": step}
            for (_, p, c), lab in zip(flat, labels)
        ]
        judged = [lab for lab in labels if lab is not None]
        metrics = {**_reward_stats([x.reward for x in samples]), "judge_malformed": float(bad)}
        for cls in LABELS:
            metrics[f"rate_{cls}"] = judged.count(cls) / max(len(judged), 1)
        metrics["completion_tokens"] = _mean(len(c.token_ids) for _, _, c in flat)
        transcripts = [
            {"phase": "blue", "iteration": iteration, "step": step, "prompt": p[1], "response": c.text, "label": lab}
            for (_, p, c), lab in list(zip(flat, labels))[: r.run.transcripts]
        ]
        return StepResult(samples, metrics, eval_rows=eval_rows, transcripts=transcripts)

    # ---------------------------------------------------------------- eval
    def eval_step(self, iteration: int, step: int) -> StepResult:
        s, r = self.s, self.s.recipe
        G = r.grpo.group_size
        t0 = time.perf_counter()
        panel_rows, panel_metrics = s.label_new_pairs(2 * r.grpo.prompts_per_step)
        self.timings["panel"] = time.perf_counter() - t0
        batch = s.sample_labelled_pairs(r.grpo.prompts_per_step)
        if not batch:
            return StepResult([], {"reward_mean": 0.0, "reward_std": 0.0, "dropped": 0.0, "labelled_pairs": 0.0, **panel_metrics}, panel_rows=panel_rows)
        reqs = [Request("eval", eval_messages(p["prompt"], p["response"]), n=G, choices=LABEL_CHOICES if self.choice else None) for p in batch]
        comps = self.generate("eval", reqs, self.policy)
        samples, correct, malformed = [], [], 0
        for g, (pair, cs) in enumerate(zip(batch, comps)):
            for c in cs:
                pred = parse_label(c.text, LABELS, finished=c.finished).label
                malformed += pred is None
                reward = eval_reward(pred, pair["panel_label"])
                correct.append(reward)
                samples.append(Sample(c.prompt_ids, c.token_ids, g, reward))
        for smp, adv in zip(samples, group_advantages([x.reward for x in samples], [x.group for x in samples], r.grpo.scale_rewards)):
            smp.advantage = adv
        metrics = {
            **_reward_stats([x.reward for x in samples]),
            "accuracy": _mean(correct),
            "judge_malformed": float(malformed),
            "labelled_pairs": float(s.labelled_count()),
            **panel_metrics,
        }
        transcripts = [
            {"phase": "eval", "iteration": iteration, "step": step, "panel_label": p["panel_label"], "output": cs[0].text}
            for p, cs in list(zip(batch, comps))[: r.run.transcripts]
        ]
        return StepResult(samples, metrics, panel_rows=panel_rows, transcripts=transcripts)

    def generate(self, what: str, requests, sampling):
        """engine.generate, timed per purpose (`seconds_<what>` in metrics)."""
        t0 = time.perf_counter()
        crash_point("generate")
        out = self.s.engine.generate(requests, sampling)
        self.timings[what] = self.timings.get(what, 0.0) + time.perf_counter() - t0
        return out

    def run_step(self, phase: str, iteration: int, step: int) -> StepResult:
        t0 = time.perf_counter()
        self.timings = {}
        result = {"red": self.red_step, "blue": self.blue_step, "eval": self.eval_step}[phase](iteration, step)
        result.metrics["rollout_seconds"] = time.perf_counter() - t0
        result.metrics.update({f"seconds_{k}": v for k, v in self.timings.items()})
        return result
