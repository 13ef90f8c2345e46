"""Eval's steps: the warm start, P_eval, and the check on held-out pairs.

Eval learns the panel's labels (experts.py) by GRPO (the paper: reward 1
when it agrees), by the cross-entropy over the forced label set
(supervised.py; `objective: sft`, the warm start's default), or both in one
update. After its warm start and every P_eval it labels the pairs held out
of its training (`experts.heldout_share`): accuracy, per-class recall, its
predicted-label distribution and its expected calibration error, which
`rewards.soft_labels: auto` reads; and, with `experts.gold_pairs`, the same
on a labelled file of the user's.
"""
from __future__ import annotations

import math
import time

from ..engine.base import BASE, Completion, Request
from ..judging.parsing import LABEL_CHOICES, LABELS, extract_wrapped_prompt, parse_label
from ..training.advantages import Sample
from ..training.supervised import ChoiceExample
from .results import mean, rates, reward_stats, step_result
from .rewards import eval_reward
from .roles import EVAL, eval_messages, judged_prompt, red_messages, styled_blue_messages, warmup_opening

ECE_BINS = 10


def calibration_error(probs: list[list[float]], gold: list[int], bins: int = ECE_BINS) -> float:
    """Expected calibration error of the top choice: |accuracy - confidence|
    per confidence bin, weighted by the bin's share of the pairs."""
    if not probs:
        return 0.0
    by: dict[int, list[tuple[float, bool]]] = {}
    for p, g in zip(probs, gold):
        top = max(range(len(p)), key=p.__getitem__)
        by.setdefault(min(int(p[top] * bins), bins - 1), []).append((p[top], top == g))
    return sum(abs(sum(c for _, c in xs) / len(xs) - sum(q for q, _ in xs) / len(xs)) * len(xs) for xs in by.values()) / len(probs)


def _softmax(totals: list[float]) -> list[float]:
    top = max(totals)
    weights = [math.exp(t - top) for t in totals]
    return [w / sum(weights) for w in weights]


def answers_before_update(extra: dict[str, float]) -> dict[str, float]:
    """Eval's accuracy and predicted-label rates on its batch, from the
    cross-entropy forward (supervised.accumulate: choice k = LABELS[k])."""
    out = {"accuracy": extra["ce_accuracy"], "judge_malformed": 0.0}
    out.update({f"pred_rate_{c}": extra.get(f"ce_pick_rate_{k}", 0.0) for k, c in enumerate(LABELS)})
    return out


def judged(probs: list[float]) -> str:
    """What eval answers when it judges in choice mode: its most likely label."""
    return LABELS[max(range(len(LABELS)), key=probs.__getitem__)]


class EvalSteps:
    """Needs the phases object (loop.Phases): its session, engine calls,
    samplings and helpers."""

    def __init__(self, phases):
        self.p = phases

    @property
    def game(self):
        return self.p.game

    # ------------------------------------------------------------- steps
    def step(self, iteration: int, step: int):
        game, r = self.game, self.game.recipe
        t0 = time.perf_counter()
        panel_rows, panel_metrics = game.data.label_new_pairs(r.experts.pairs_per_step or 2 * self.game.prompts_of("eval"))
        self.p.timings["panel"] = time.perf_counter() - t0
        return self.train(iteration, step, panel_rows, panel_metrics, "eval")

    def warmup(self, iteration: int, step: int):
        """Eval's warm start. Step 1: the untrained red wraps half the seed
        requests (the other half go as written), the untrained blue (= the
        base) answers them and benign requests in each of `answer_styles`,
        each styled answer started with its opening words (`warmup_opening`),
        the panel labels every pair. Every step: eval learns them
        (`phases.eval_warmup.objective`). After blue's warm start
        (`after_blue_warmup`) blue's own answers are the warm-started blue's
        and the styled ones still the bare base's: a warm-started blue
        refuses with guidance even when asked to refuse plainly or to
        comply, and eval would meet no plain refusal of a harmful request."""
        game, r = self.game, self.game.recipe
        cfg = r.phases.eval_warmup
        panel_rows, panel_metrics, eval_rows = [], {}, []
        if step == 1:
            t0 = time.perf_counter()
            n = max(cfg.pairs // len(cfg.answer_styles), 1)
            share = cfg.benign_share
            benign = game.data.next_benign((n // 2 if share is None else round(n * share)) if game.data.benign else 0)
            items = game.data.next_seed_items(n - len(benign))
            # half the harmful requests as red will wrap them, half as written:
            # an untrained red's wraps often lose the request, and eval judges both
            raw, wrapped = items[: len(items) // 2], items[len(items) // 2:]
            wraps = self.p.generate("red", [Request("red", red_messages(b.prompt, t)) for b, t in wrapped], self.p.sampling["red"])
            prompts = [(b.prompt, b.prompt, "harmful") for b, _ in raw]
            prompts += [(b.prompt, extract_wrapped_prompt(w[0].text) or b.prompt, "harmful") for (b, _), w in zip(wrapped, wraps)]
            prompts += [(b.prompt, b.prompt, "benign") for b in benign]
            asked = [(p, style) for style in cfg.answer_styles for p in prompts]
            styled_by = BASE if cfg.after_blue_warmup else "blue"  # who answers when asked to refuse / guide / comply
            answers = self.p.generate("blue", [Request("blue" if style == "blue" else styled_by, styled_blue_messages(p[1], style),
                                                       prefix=warmup_opening(style)) for p, style in asked], self.p.sampling["blue"])
            eval_rows = [
                {"prompt": judged_prompt(self.p.judge_view, p[0], p[1]), "wrapped": p[1],
                 "response": warmup_opening(style) + a[0].text, "defender": "blue", "basic": p[0], "kind": p[2],
                 "eval_label": None,
                 "style": style, "iteration": iteration, "phase": "eval_warmup", "step": step}
                for (p, style), a in zip(asked, answers)
            ]
            panel_rows, panel_metrics = game.data.label_fresh(eval_rows)
            self.p.timings["panel"] = time.perf_counter() - t0
        result = self.train(iteration, step, panel_rows, panel_metrics, "eval_warmup")
        result.rows["eval_pairs"] = eval_rows
        return result

    def train(self, iteration, step, panel_rows, panel_metrics, phase):
        game, r = self.game, self.game.recipe
        objective = (r.phases.eval_warmup if phase == "eval_warmup" else r.phases.eval).objective
        batch = game.data.sample_labelled_pairs(self.game.prompts_of("eval"))
        if not batch:
            return step_result([], {"reward_mean": 0.0, "reward_std": 0.0, "dropped": 0.0, "labelled_pairs": 0.0, **panel_metrics},
                               panel=panel_rows)
        samples, preds, comps, metrics = [], [], [], {}
        if "grpo" in objective:
            samples, preds, comps = self._grpo_samples(batch)
            metrics.update(reward_stats([x.reward for x in samples]), **self.p._set_advantages(samples, "eval"))
        examples = self.examples(batch) if objective.startswith("sft") else []
        # sft alone in choice mode: what eval answers now comes out of the
        # update's own forward (it scores every label before the step), not
        # a judge call of its own (6.5 s of a 26 s warm-start step at 135M)
        from_update = bool(examples) and not preds and self.p.choice
        if preds:
            metrics["accuracy"] = mean([eval_reward(p, x["panel_label"]) for p, x in zip(preds, batch)])
            metrics["judge_malformed"] = float(sum(p is None for p in preds))
            metrics.update(rates(preds, "pred_rate_"))
        metrics.update({"labelled_pairs": float(game.data.labelled_count()), **rates([p["panel_label"] for p in batch], "gold_rate_"),
                        **panel_metrics})
        transcripts = [
            {"phase": phase, "iteration": iteration, "step": step, "panel_label": p["panel_label"],
             "output": cs[0].text if cs else pred}
            for p, cs, pred in list(zip(batch, comps or [[]] * len(batch), preds or [None] * len(batch)))[: r.run.transcripts]
        ]
        smoothing = r.phases.eval.label_smoothing if phase == "eval" else 0.0
        return step_result(samples, metrics, panel=panel_rows, transcripts=transcripts, examples=examples, smoothing=smoothing,
                           after_update=answers_before_update if from_update else None)

    def _request(self, pair: dict, n: int = 1) -> Request:
        return Request(EVAL, self._messages(pair), n=n, choices=LABEL_CHOICES if self.p.choice else None)

    def _messages(self, pair: dict) -> list[dict[str, str]]:
        """Eval's chat for a stored pair: the pair's kind too with rewards.eval_sees_kind."""
        return eval_messages(pair["prompt"], pair["response"], pair.get("kind", "harmful") if self.p.sees_kind else None)

    def examples(self, batch: list[dict]) -> list[ChoiceExample]:
        """The batch as supervised examples: every label string (choice mode)
        or the panel's label line alone (generate mode), the panel's the gold."""
        engine = self.game.engine
        out = []
        for pair in batch:
            prompt = engine.encode(self._messages(pair))
            gold = LABELS.index(pair["panel_label"])
            choices = [engine.choice_ids(c) for c in LABEL_CHOICES] if self.p.choice else [engine.choice_ids(LABEL_CHOICES[gold])]
            out.append(ChoiceExample(prompt, choices, gold if self.p.choice else 0, pair.get("kind")))
        return out

    def _grpo_samples(self, batch: list[dict]):
        r = self.game.recipe
        reqs = [self._request(p, self.game.group_size_of("eval")) for p in batch]
        enumerate_ = self.p.choice and r.rewards.choice_rollouts == "enumerate"
        comps = self._enumerate_choices(reqs) if enumerate_ else self.p.generate("eval", reqs, self.p.sampling["eval"])
        samples, preds = [], []
        for g, (pair, cs) in enumerate(zip(batch, comps)):
            labels = [parse_label(c.text, LABELS, finished=c.finished).label for c in cs]
            samples += [Sample(c.prompt_ids, c.token_ids, g, eval_reward(lab, pair["panel_label"]), truncated=not c.finished,
                               kind=pair.get("kind")) for c, lab in zip(cs, labels)]
            # what eval answers when it judges: its most likely label (enumerated), else its first sample
            preds.append(judged(cs[0].choice_probs) if enumerate_ else labels[0])
        return samples, preds, comps

    def _scores(self, reqs: list[Request]) -> list[list[list[float]]]:
        """Each choice's token log-probs, per request (one engine call, timed)."""
        t0 = time.perf_counter()
        out = self.game.engine.score_choices(reqs)
        self.p.timings["eval"] = self.p.timings.get("eval", 0.0) + time.perf_counter() - t0
        return out

    def _choice_probs(self, reqs: list[Request]) -> list[list[float]]:
        return [_softmax([sum(lp) for lp in per_choice]) for per_choice in self._scores(reqs)]

    def _enumerate_choices(self, reqs: list[Request]) -> list[list]:
        """Every label once per pair (rewards 1 for the panel's, 0 for the
        others): the group's advantages never vanish, unlike G samples from
        a peaked choice distribution, and the update is the exact
        group-relative one over the whole choice set."""
        engine = self.game.engine
        out = []
        for req, per_choice in zip(reqs, self._scores(reqs)):
            probs = _softmax([sum(lp) for lp in per_choice])
            prompt = engine.encode(req.messages)
            out.append([Completion(EVAL, choice, prompt, engine.choice_ids(choice), lp, True, sample_index=k, choice_probs=probs)
                        for k, (choice, lp) in enumerate(zip(req.choices, per_choice))])
        return out

    # --------------------------------------------------------- held out
    def checks(self, iteration: int, after: str) -> list[dict]:
        """Eval on the pairs kept out of its training (`eval_heldout`; its
        calibration error goes to the state, for soft labels) and on the
        recipe's gold file (`eval_gold`, after the phases in
        `experts.gold_after`): one metrics row each."""
        game = self.game
        held = self.check_heldout(iteration, after)
        rows = [held] if held else []
        if held and "ece" in held:
            game.state["eval_ece"] = held["ece"]
        if game.data.gold and after in game.recipe.experts.gold_after:
            rows.append(self._check(iteration, after, "eval_gold", game.data.gold, [x["label"] for x in game.data.gold]))
        return rows

    def check_heldout(self, iteration: int, after: str) -> dict | None:
        """Eval on the pairs kept out of its training: one `eval_heldout` row (None: no pair is held out)."""
        held = self.game.data.heldout_pairs()
        return self._check(iteration, after, "eval_heldout", held, [x["panel_label"] for x in held]) if held else None

    def _check(self, iteration: int, after: str, phase: str, pairs: list[dict], gold: list[str]) -> dict:
        t0 = time.perf_counter()
        if self.p.choice:
            probs = self._choice_probs([self._request(x) for x in pairs])
            preds = [judged(p) for p in probs]
            ece = calibration_error(probs, [LABELS.index(g) for g in gold])
        else:
            outs = self.p.generate("eval", [self._request(x) for x in pairs], self.p.judge_sampling)
            preds = [parse_label(o[0].text, LABELS, finished=o[0].finished).label for o in outs]
            ece = None
        row = {"iteration": iteration, "phase": phase, "after": after, "step": 0, "n": len(pairs),
               "accuracy": sum(p == g for p, g in zip(preds, gold)) / len(pairs)}
        for c in LABELS:
            mine = [p for p, g in zip(preds, gold) if g == c]
            row[f"recall_{c}"] = sum(p == c for p in mine) / len(mine) if mine else None
            row[f"pred_rate_{c}"] = sum(p == c for p in preds) / len(preds)
            # per request kind too: one `positive` recall over both kinds hid a warm-started eval that called 9 of 10
            # refusals with guidance to harmful requests compliances while it got benign help right (2026-12-05)
            for kind in ("harmful", "benign"):
                of_kind = [p for p, g, x in zip(preds, gold, pairs) if g == c and x.get("kind") == kind]
                if of_kind:
                    row[f"recall_{kind}_{c}"] = sum(p == c for p in of_kind) / len(of_kind)
        if ece is not None:
            row["ece"] = round(ece, 6)
        # a check is instrumentation, not training: its cost is reported apart
        row["check_seconds"] = round(time.perf_counter() - t0, 3)
        return row
