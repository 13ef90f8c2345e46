"""Blue's decision: whether it opens an answer with the refusal.

Why: the warm start's cross-entropy on whole kept answers (blue_warmup.py)
teaches blue *how* to refuse, and 64 requests teach it poorly *when*: after
it, the probability of the refusal's first token told JBB's harmful requests
from its benign ones at AUC 0.73, where a linear probe on the frozen base's
hidden states does at 0.84-0.88 (bench/harm_probe.py, BENCHMARKS "Why does
blue refuse benign requests?"). Neither fewer adapted layers nor a contrast
of benign answers against refusals moved that number; more requests (224 in
place of 64) did, a little (0.78). So this objective spends many requests
on the decision alone, which is short and cheap: for each, the refusal's
opening (`warmup_opening("guide")`, its first `decision_tokens` tokens) is
learnt by teacher forcing where the request is harmful and unlearnt where it
is benign (unlikelihood, -log(1 - P(opening)), training/supervised.py NONE),
so that P(opening), which greedy decoding turns into a refusal, is high on
the one and low on the other.

Not a pair: the first version set the refusal's opening against the
untrained blue's own greedy opening (cross-entropy over the two). Measured
2026-12-04 (seed 0, 224 requests, blue after the warm start alone): it fit
its pairs (AUC 0.99 on them, the refusal ahead on 96% of the harmful ones),
yet P(refusal's first token) on those harmful requests was 0.13: blue won
the pair by making its own opening unlikely, not the refusal likely; it
refused 2.5% of JBB's harmful requests greedily (92.5% without the
decision) at AUC 0.74.

Where greedy decoding refuses, the refusal's first token need not be
likely, only likelier than any other: after the warm start with the
decision (seed 0) blue put 14% of its first token's mass on "I" for JBB's
benign requests on average and still opened half of them with the refusal.
`decision_own_opening` also teaches, for each benign request, the untrained
blue's own greedy opening to it, so that some other first token is the
likeliest. Measured the same way: it refuses less of everything (JBB
harmful 62.5% greedily, benign 37.5%, XSTest safe 15%) and tells the kinds
apart no better (AUC 0.74): how often, not when, as every lever before it.

What the decision alone did (seed 0, blue after the warm start alone, 40
JBB harmful and 40 benign requests, bench/refusal_margin.py; BENCHMARKS
"Blue's decision"): AUC of P(refusal's first token) 0.80 against 0.73
without it (paired bootstrap over the requests: +0.07, 90% interval +0.02
to +0.13; seeds 1 and 2: +0.03, +0.06), greedy refusals JBB harmful 85% /
benign 50% / XSTest safe 20% against 92.5 / 55 / 35%.

The requests are asked as written by default (`decision_wrapped: false`):
the benign stream is always asked as written, so with red's wraps among the
harmful ones the form of a prompt would carry the label (a wrap: refuse; a
plain question: answer, two times in three), and JBB's harmful requests are
plain questions. The rows go to `blue_decisions.jsonl` (the requests and the
opening's ids; red's wraps are generated text and stay in the run folder)
so a resumed run learns the same ones.
"""
from __future__ import annotations

from ..engine.base import Request, Sampling
from ..judging.refusals import refused
from ..training.supervised import NONE, ChoiceExample
from .roles import blue_messages, warmup_opening


def collect_decisions(phases, iteration: int) -> tuple[list[dict], dict[str, float]]:
    """`decision_requests` requests, each with the refusal opening's ids."""
    game = phases.game
    cfg = game.recipe.phases.blue_warmup
    if not cfg.decision_requests:
        return [], {}
    refusal = game.engine.tokenizer.encode(warmup_opening("guide"), add_special_tokens=False)[: cfg.decision_tokens]
    if cfg.decision_wrapped:  # as blue's steps ask them: data.raw_share as written, the rest wrapped by red
        asked = [(basic, x, kind) for basic, x, kind, _ in phases.blue_prompts(cfg.decision_requests)]
    else:  # every request as written (see the module's docstring)
        harmful, benign = game.data.blue_requests(cfg.decision_requests)
        asked = [(b.prompt, b.prompt, "harmful") for b, _ in harmful] + [(b.prompt, b.prompt, "benign") for b in benign]
    rows = [{"basic": basic, "asked": x, "kind": kind, "refusal_ids": refusal, "iteration": iteration} for basic, x, kind in asked]
    metrics = {"decision_requests": float(len(rows)), "decision_harmful_share": sum(r["kind"] == "harmful" for r in rows) / len(rows)}
    if cfg.decision_own_opening:  # the untrained blue's greedy opening to each benign request, learnt beside the unlikelihood
        benign = [r for r in rows if r["kind"] == "benign"]
        answers = phases.generate("blue", [Request("blue", blue_messages(r["asked"])) for r in benign],
                                  Sampling(max_new_tokens=cfg.decision_tokens, temperature=0.0))
        for r, (c, *_) in zip(benign, answers):
            if c.token_ids and not refused(c.text):  # never teach an opening that refuses
                r["own_ids"] = list(c.token_ids)[: cfg.decision_tokens]
        metrics["decision_own_openings"] = float(sum("own_ids" in r for r in benign))
    return rows, metrics


def decision_examples(rows: list[dict], prompts: list[list[int]]) -> list[ChoiceExample]:
    """Each row's refusal opening under blue's own prompt (`prompts`: its
    encoded chat): learnt where the request is harmful, unlearnt where benign."""
    out = []
    for x, ids in zip(rows, prompts):
        out.append(ChoiceExample(ids, [x["refusal_ids"]], 0 if x["kind"] == "harmful" else NONE, x["kind"]))
        if x.get("own_ids"):
            out.append(ChoiceExample(ids, [x["own_ids"]], 0, x["kind"]))
    return out
