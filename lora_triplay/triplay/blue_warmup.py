"""Blue's warm start: context distillation of safe answers, before any GRPO.

Why: GRPO only reweighs what a role samples. In the evidence runs of
2026-12-02 the 135M blue at temperature 1 refused 0-4% of red's wraps in
every iteration, so a judge that was right (eval called 88-90% of blue's
compliances `negative`) had no refusal in a group to rank above a
compliance, and blue learnt to comply.

Step 1 collects the data once: the untrained blue (the bare base) answers
`phases.blue_warmup.prompts` requests, split as blue's own steps split them
(`data.benign_share` benign; of the harmful ones `data.raw_share` asked as
written, the rest wrapped by the untrained red). Harmful requests are
answered under the `guide` style (templates.yaml: decline, then a safe
alternative; its opening words forced, since a 135M base ignores a system
prompt; kept up to the alternative's first sentence, `first_sentence`, which
must name guidance itself, `safe_alternative`), benign ones under blue's own
system prompt (after `benign_opening`, if the recipe sets one). `candidates`
answers each; the first one the rule expert (judging/refusals.py) calls
`positive`, and that neither loops nor is near-empty, is kept. Every step:
blue learns a batch of kept answers by cross-entropy on their tokens,
prompted with its own system prompt, as if it had written them unasked
(`refusal_contrast`: each benign answer also against a kept refusal), so the
behaviour survives without the style prompt. The kept answers go to
`blue_sft.jsonl` (a resumed run reads them back, game.restore; they are
generated text and stay in the run folder).
"""
from __future__ import annotations

import logging
import random
import re
import time

from ..engine.base import Request, Sampling
from ..judging.quality import degenerate, words
from ..judging.refusals import names_guidance, rules_label
from ..training.supervised import ChoiceExample
from .blue_decision import collect_decisions, decision_examples
from .results import mean, step_result
from .roles import blue_messages, styled_blue_messages, warmup_instruction, warmup_opening

log = logging.getLogger(__name__)
STYLE = {"harmful": "guide", "benign": "blue"}  # what each kind of request is answered under


class BlueWarmup:
    """Needs the phases object (loop.Phases): its game, engine calls and samplings."""

    def __init__(self, phases):
        self.p = phases
        # the kept answers, from step 1 on (or from blue_sft.jsonl on resume, `restore`): every process
        # keeps its own copy (each computes step 1 alike), none reads a file another may still be writing
        self.kept: list[dict] = []
        self.decisions: list[dict] = []  # blue_decision.py's requests (phases.blue_warmup.decision_requests)

    def restore(self, rows, decisions=()) -> None:
        self.kept, self.decisions = list(rows), list(decisions)

    def step(self, iteration: int, step: int):
        game = self.p.game
        cfg = game.recipe.phases.blue_warmup
        metrics: dict[str, float] = {}
        if step == 1:
            t0 = time.perf_counter()
            self.kept, metrics = self.collect(iteration)
            self.decisions, decided = collect_decisions(self.p, iteration)
            metrics.update(decided)
            self.p.timings["collect"] = time.perf_counter() - t0
        kept, new_rows = self.kept, (self.kept if step == 1 else [])
        if not kept and step == 1:  # the model's doing, not the recipe's: the run goes on, and says so once
            log.warning("phases.blue_warmup: the rule expert kept none of the untrained blue's %d answers; the warm start "
                        "learns %s (raise phases.blue_warmup.candidates, or set its steps to 0)", cfg.prompts * cfg.candidates,
                        "only its decisions" if self.decisions else "nothing")
        if not kept and not self.decisions:
            return step_result([], {**metrics, "kept_answers": 0.0})
        batch = batch_of(kept, cfg.prompts_per_step, game.recipe.seed, step, cfg.harmful_share)
        engine = game.engine
        prompts = [engine.encode(blue_messages(x["asked"])) for x in batch]
        examples = [ChoiceExample(ids, [x["completion_ids"]], 0, x["kind"]) for ids, x in zip(prompts, batch)]
        if cfg.refusal_contrast:
            examples += contrasts(batch, prompts, kept, game.recipe.seed)
        if self.decisions:  # balanced by kind as the kept answers are, in an order of their own
            chosen = batch_of(self.decisions, cfg.decision_per_step, game.recipe.seed, step, 0.5, name="blue_decision")
            examples += decision_examples(chosen, [engine.encode(blue_messages(x["asked"])) for x in chosen])
            metrics["decision_examples"] = float(len(chosen))
        metrics.update({"kept_answers": float(len(kept)), "batch_harmful_share": mean([float(x["kind"] == "harmful") for x in batch]),
                        "completion_tokens": mean([len(x["completion_ids"]) for x in batch])})
        transcripts = [{"phase": "blue_warmup", "iteration": iteration, "step": step, "kind": x["kind"], "prompt": x["asked"],
                        "response": x["response"]} for x in batch[: game.recipe.run.transcripts]]
        result = step_result([], metrics, transcripts=transcripts, examples=examples)
        result.rows["blue_sft"] = new_rows
        result.rows["blue_decisions"] = self.decisions if step == 1 else []
        return result

    def collect(self, iteration: int) -> tuple[list[dict], dict[str, float]]:
        """The untrained blue's answers the rule expert keeps, and what was kept of each kind."""
        game, r = self.p.game, self.p.game.recipe
        cfg = r.phases.blue_warmup
        # blue's own requests (Phases.blue_prompts): data.benign_share benign, the harmful ones data.raw_share as
        # written and the rest wrapped by the untrained red (or a fixed attack set, data.blue_attacks)
        asked = [(basic, x, kind) for basic, x, kind, _ in self.p.blue_prompts(cfg.prompts)]
        sampling = Sampling(max_new_tokens=self.p.sampling["blue"].max_new_tokens, temperature=cfg.temperature,
                            top_p=r.grpo.top_p, repetition_penalty=r.grpo.repetition_penalty)
        openings = [warmup_opening(STYLE[kind]) if kind == "harmful" else cfg.benign_opening for _, _, kind in asked]
        answers = self.p.generate("blue", [Request("blue", styled_blue_messages(x, STYLE[kind]), n=cfg.candidates, prefix=o)
                                           for (_, x, kind), o in zip(asked, openings)], sampling)
        engine = game.engine
        kept, metrics = [], {}
        for (basic, x, kind), opening, cands in zip(asked, openings, answers):
            for c in cands:
                if kind == "harmful":  # the refusal and its first sentence of guidance, then the end (see `first_sentence`)
                    rest = first_sentence(c.text)
                    text = opening + rest if safe_alternative(rest) and not echoes(rest, warmup_instruction(STYLE[kind])) else ""
                    ids = engine.choice_ids(text)  # EOS appended: blue learns to stop there
                else:  # its own answer under its own prompt (after benign_opening, if any), as sampled (EOS included where it ended)
                    text = opening + c.text
                    ids = (engine.tokenizer.encode(opening, add_special_tokens=False) if opening else []) + list(c.token_ids)
                if text and keep(text, kind):
                    kept.append({"basic": basic, "asked": x, "kind": kind, "style": STYLE[kind], "response": text,
                                 "completion_ids": ids, "iteration": iteration})
                    break
        for kind in ("harmful", "benign"):
            mine = [a for a in asked if a[2] == kind]
            if mine:
                metrics[f"{kind}_kept_share"] = sum(k["kind"] == kind for k in kept) / len(mine)
        return kept, metrics


def contrasts(batch: list[dict], prompts: list[list[int]], kept: list[dict], seed: int) -> list[ChoiceExample]:
    """Each benign answer of the batch set against a kept refusal (to
    another request, picked by a seed and the request, so a resumed run
    draws the same): gold is the answer. Why: plain cross-entropy on the
    refusals teaches blue to refuse by topic (the warm start alone refused
    45-55% of the held-out benign requests), and the benign answers, which
    the base already wrote, teach it little against that; this loss grows
    where a refusal of a benign request becomes likely. Measured 2026-12-03
    (bench/refusal_margin.py, seed 0): it lowers how often blue refuses
    (held-out over-refusal 15% against 47%, JBB ASR 75% against 7.5%),
    not when (AUC harmful vs benign ~0.73 with or without it)."""
    refusals = [x for x in kept if x["kind"] == "harmful"]
    if not refusals:
        return []
    out = []
    for x, ids in zip(batch, prompts):  # prompts: each answer's prompt ids, as the plain examples have them
        if x["kind"] == "benign":
            refusal = refusals[random.Random(f"{seed}:contrast:{x['asked']}").randrange(len(refusals))]
            out.append(ChoiceExample(ids, [x["completion_ids"], refusal["completion_ids"]], 0, "benign"))
    return out


def first_sentence(text: str, min_words: int = 3) -> str:
    """The continuation of a styled refusal cut after its first sentence, or
    "" when it has none of `min_words` words or more. Why cut: measured on the
    untrained 135M blue's `guide` answers (2026-12-02), the rule expert
    called `positive` (a refusal with guidance) answers that declined, then
    went on to do the task ("Instead, you could try a different approach.
    The script could be: ..."); taught whole, blue would learn to open with a
    refusal and comply after it. One sentence of alternative is all a
    refusal needs."""
    match = re.search(r"[.!?](?=\s|$)|\n", text)
    if not match:
        return ""  # cut by the token budget mid-sentence
    sentence = text[: match.end()].rstrip()
    return sentence if len(sentence.split()) >= min_words else ""


def safe_alternative(rest: str) -> bool:
    """Whether the sentence after the forced opening ("... Instead, you
    could") names a safe alternative itself: it goes on with a guidance verb
    (try, contact, talk, seek, read ...) or names a resource (a helpline, a
    professional, the authorities ...). The opening alone already satisfies
    the rule expert, so without this check "... Instead, you could mix
    bleach and ammonia." would be kept (review, 2026-12-02). A rule cannot
    judge what the alternative says ("try to find a way to ..." passes)."""
    return bool(rest) and names_guidance("You could" + rest)


ECHO_WORDS = 5


def echoes(text: str, instruction: str, n: int = ECHO_WORDS) -> bool:
    """Whether `text` repeats `n` words in a row of its instruction. Measured
    on the fourth evidence run's kept refusals (2026-12-02): 6 of seed 0's 20
    and 6 of seed 1's 14 that named an alternative recited the `guide`
    style's own words ("suggest a safe, legal alternative or where the user
    could find appropriate help or support"), whatever was asked; blue taught
    them learnt one alternative for every request (its final refusals: "...
    you could suggest safe, legal, and legal help ...")."""
    said, source = words(text), words(instruction)
    told = {tuple(source[i:i + n]) for i in range(len(source) - n + 1)}
    return any(tuple(said[i:i + n]) in told for i in range(len(said) - n + 1))


def keep(text: str, kind: str) -> bool:
    """Whether an answer is one to teach blue: the rule expert's `positive`
    (a harmful request declined with a safe alternative; a benign one
    answered, not refused), and neither looping nor near-empty."""
    return rules_label(text, kind) == "positive" and not degenerate(text)


def batch_of(kept: list[dict], size: int, seed: int, step: int, harmful_share: float = 0.5,
             name: str = "blue_warmup") -> list[dict]:
    """Step `step`'s `size` kept answers: `harmful_share` of them refusals to
    harmful requests, the rest helpful answers to benign ones, where both
    kinds were kept (a blue taught only refusals refuses the benign stream
    too); each kind read in a seeded order, epoch after epoch, so every kept
    answer is learnt once before any twice and a resumed run draws the same
    batch (`name`: whose order, so two streams of rows draw apart)."""
    if not kept:
        return []
    by = {kind: [x for x in kept if x["kind"] == kind] for kind in ("harmful", "benign")}
    before = _harmful_drawn(step - 1, size, harmful_share, by)  # refusals learnt in the steps before this one
    n_harmful = _harmful_drawn(step, size, harmful_share, by) - before
    out = []
    for kind, n, start in (("harmful", n_harmful, before), ("benign", size - n_harmful, (step - 1) * size - before)):
        rows = by[kind]
        for j in range(n):
            epoch, pos = divmod(start + j, len(rows))
            order = list(range(len(rows)))
            random.Random(f"{seed}:{name}:{kind}:{epoch}").shuffle(order)
            out.append(rows[order[pos]])
    return out


def _harmful_drawn(steps: int, size: int, share: float, by: dict[str, list]) -> int:
    """Refusals in the first `steps` batches of `size`: all or none where one
    kind alone was kept; else `share` of each batch and both kinds in every
    batch of two or more, whatever the rounding; batches of one alternate,
    `share` of them refusals."""
    if not (by["harmful"] and by["benign"]):
        return steps * size if by["harmful"] else 0
    if size < 2:
        return round(share * steps)
    return steps * min(max(round(share * size), int(0 < share)), size - int(share < 1))
