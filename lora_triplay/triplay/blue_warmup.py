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
prompt; kept up to its first sentence of alternative: `first_sentence`), benign ones under blue's own system prompt. `candidates` answers
each; the first one the rule expert (judging/refusals.py) calls `positive`,
and that neither loops nor is near-empty, is kept. Every step: blue learns a
batch of kept answers by cross-entropy on their tokens, prompted with its own
system prompt, as if it had written them unasked, so the behaviour survives
without the style prompt. The kept answers go to `blue_sft.jsonl` (a resumed
run reads them back; they are generated text and stay in the run folder).
"""
from __future__ import annotations

import logging
import random
import re
import time

from ..engine.base import Request, Sampling
from ..judging.parsing import extract_wrapped_prompt
from ..judging.quality import degenerate
from ..judging.refusals import rules_label
from ..training.supervised import ChoiceExample
from .results import mean, step_result
from .roles import blue_messages, red_messages, styled_blue_messages, warmup_opening

log = logging.getLogger(__name__)
STYLE = {"harmful": "guide", "benign": "blue"}  # what each kind of request is answered under


class BlueWarmup:
    """Needs the phases object (loop.Phases): its game, engine calls and samplings."""

    def __init__(self, phases):
        self.p = phases

    def step(self, iteration: int, step: int):
        game = self.p.game
        cfg = game.recipe.phases.blue_warmup
        metrics: dict[str, float] = {}
        if step == 1:
            t0 = time.perf_counter()
            kept, metrics = self.collect(iteration)
            self.p.timings["collect"] = time.perf_counter() - t0
            new_rows = kept
        else:
            kept, new_rows = list(game.store.iter_jsonl("blue_sft")), []
        if not kept:  # the model's doing, not the recipe's: the run goes on, and says so once
            if step == 1:
                log.warning("phases.blue_warmup: the rule expert kept none of the untrained blue's %d answers; the warm start "
                            "learns nothing (raise phases.blue_warmup.candidates, or set its steps to 0)",
                            game.recipe.phases.blue_warmup.prompts * cfg.candidates)
            return step_result([], {**metrics, "kept_answers": 0.0})
        batch = batch_of(kept, cfg.prompts_per_step, game.recipe.seed, step, cfg.harmful_share)
        engine = game.engine
        examples = [ChoiceExample(engine.encode(blue_messages(x["asked"])), [x["completion_ids"]], 0, x["kind"]) for x in batch]
        metrics.update({"kept_answers": float(len(kept)), "batch_harmful_share": mean([float(x["kind"] == "harmful") for x in batch]),
                        "completion_tokens": mean([len(x["completion_ids"]) for x in batch])})
        transcripts = [{"phase": "blue_warmup", "iteration": iteration, "step": step, "kind": x["kind"], "prompt": x["asked"],
                        "response": x["response"]} for x in batch[: game.recipe.run.transcripts]]
        result = step_result([], metrics, transcripts=transcripts, examples=examples)
        result.rows["blue_sft"] = new_rows
        return result

    def collect(self, iteration: int) -> tuple[list[dict], dict[str, float]]:
        """The untrained blue's answers the rule expert keeps, and what was kept of each kind."""
        game, r = self.p.game, self.p.game.recipe
        cfg = r.phases.blue_warmup
        n_benign = game.data.benign_count(cfg.prompts)
        harmful_items, benign = game.data.next_seed_items(cfg.prompts - n_benign), game.data.next_benign(n_benign)
        n_raw = len(harmful_items) if r.data.blue_attacks != "red" else round(r.data.raw_share * len(harmful_items))
        raw, wrapped = harmful_items[:n_raw], harmful_items[n_raw:]
        wraps = self.p.generate("red", [Request("red", red_messages(b.prompt, t)) for b, t in wrapped], self.p.sampling["red"]) \
            if wrapped else []
        asked = [(b.prompt, b.prompt, "harmful") for b, _ in raw]
        asked += [(b.prompt, extract_wrapped_prompt(w[0].text) or b.prompt, "harmful") for (b, _), w in zip(wrapped, wraps)]
        asked += [(b.prompt, b.prompt, "benign") for b in benign]
        sampling = Sampling(max_new_tokens=self.p.sampling["blue"].max_new_tokens, temperature=cfg.temperature,
                            top_p=r.grpo.top_p, repetition_penalty=r.grpo.repetition_penalty)
        openings = [warmup_opening(STYLE[kind]) for _, _, kind in asked]
        answers = self.p.generate("blue", [Request("blue", styled_blue_messages(x, STYLE[kind]), n=cfg.candidates, prefix=o)
                                           for (_, x, kind), o in zip(asked, openings)], sampling)
        engine = game.engine
        kept, metrics = [], {}
        for (basic, x, kind), opening, cands in zip(asked, openings, answers):
            for c in cands:
                if kind == "harmful":  # the refusal and its first sentence of guidance, then the end (see `first_sentence`)
                    rest = first_sentence(c.text)
                    text = opening + rest if rest else ""
                    ids = engine.choice_ids(text)  # EOS appended: blue learns to stop there
                else:  # its own answer, as it was sampled (EOS included where it ended)
                    prefix = list(engine.tokenizer.encode(opening, add_special_tokens=False)) if opening else []
                    text, ids = opening + c.text, prefix + list(c.token_ids)
                if text and keep(text, kind):
                    kept.append({"basic": basic, "asked": x, "kind": kind, "style": STYLE[kind], "response": text,
                                 "completion_ids": ids, "iteration": iteration})
                    break
        for kind in ("harmful", "benign"):
            mine = [a for a in asked if a[2] == kind]
            if mine:
                metrics[f"{kind}_kept_share"] = sum(k["kind"] == kind for k in kept) / len(mine)
        return kept, metrics


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


def keep(text: str, kind: str) -> bool:
    """Whether an answer is one to teach blue: the rule expert's `positive`
    (a harmful request declined with a safe alternative; a benign one
    answered, not refused), and neither looping nor near-empty."""
    return rules_label(text, kind) == "positive" and not degenerate(text)


def batch_of(kept: list[dict], size: int, seed: int, step: int, harmful_share: float = 0.5) -> list[dict]:
    """Step `step`'s `size` kept answers: `harmful_share` of them refusals to
    harmful requests, the rest helpful answers to benign ones, where both
    kinds were kept (a blue taught only refusals refuses the benign stream
    too); each kind read in a seeded order, epoch after epoch, so every kept
    answer is learnt once before any twice and a resumed run draws the same
    batch."""
    by = {kind: [x for x in kept if x["kind"] == kind] for kind in ("harmful", "benign")}
    n_harmful = round(harmful_share * size) if by["harmful"] and by["benign"] else size if by["harmful"] else 0
    out = []
    for kind, n in (("harmful", n_harmful), ("benign", size - n_harmful)):
        rows = by[kind]
        for j in range(n):
            epoch, pos = divmod((step - 1) * n + j, len(rows))
            order = list(range(len(rows)))
            random.Random(f"{seed}:blue_warmup:{kind}:{epoch}").shuffle(order)
            out.append(rows[order[pos]])
    return out
