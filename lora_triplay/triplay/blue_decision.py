"""Blue's decision: which first words it opens an answer with, refusal or help.

Why: the warm start's cross-entropy on whole kept answers (blue_warmup.py)
teaches blue *how* to refuse, and 64 requests teach it poorly *when*: after
it, the probability of the refusal's first token told JBB's harmful requests
from its benign ones at AUC 0.73, where a linear probe on the frozen base's
hidden states does at 0.84-0.88 (bench/harm_probe.py, BENCHMARKS "Why does
blue refuse benign requests?"). Neither fewer adapted layers nor a contrast
of benign answers against refusals moved that number; more requests (224 in
place of 64) did, a little (0.78). So this objective spends the requests on
the decision alone, which is short and cheap: for every request, harmful and
benign alike, the refusal's opening (`warmup_opening("guide")`) set against
the untrained blue's own greedy opening to it, `decision_tokens` tokens each;
cross-entropy over the pair's summed log-probs, the refusal gold for a
harmful request and blue's own opening for a benign one. It is a logistic
loss on the margin between the two openings, which is what greedy decoding
turns into a refusal or an answer.

The requests are asked as written by default (`decision_wrapped: false`):
the benign stream is always asked as written, so with red's wraps among the
harmful ones the form of a prompt would carry the label (a wrap: refuse; a
plain question: answer, two times in three), and JBB's harmful requests are
plain questions. Measured 2026-12-04 (seed 0, blue after the warm start
alone, bench/refusal_margin.py) with the wraps in: blue refused 15% of JBB's
harmful requests greedily (92.5% without the decision) and 10% of its benign
ones, at AUC 0.71.

A benign request whose own opening already refuses (the base refused it) is
left out: its gold would teach a refusal. The rows go to
`blue_decisions.jsonl` (generated text: they stay in the run folder) so a
resumed run learns the same pairs.
"""
from __future__ import annotations

from ..engine.base import Request, Sampling
from ..judging.refusals import refused
from ..training.supervised import ChoiceExample
from .roles import blue_messages, warmup_opening


def collect_decisions(phases, iteration: int) -> tuple[list[dict], dict[str, float]]:
    """The untrained blue's greedy opening to `decision_requests` requests,
    each beside the refusal's opening; returns the rows and what was kept."""
    game = phases.game
    cfg = game.recipe.phases.blue_warmup
    if not cfg.decision_requests:
        return [], {}
    k = cfg.decision_tokens
    refusal = game.engine.tokenizer.encode(warmup_opening("guide"), add_special_tokens=False)[:k]
    if cfg.decision_wrapped:  # as blue's steps ask them: data.raw_share as written, the rest wrapped by red
        asked = [(basic, x, kind) for basic, x, kind, _ in phases.blue_prompts(cfg.decision_requests)]
    else:  # every request as written (see the module's docstring)
        harmful, benign = game.data.blue_requests(cfg.decision_requests)
        asked = [(b.prompt, b.prompt, "harmful") for b, _ in harmful] + [(b.prompt, b.prompt, "benign") for b in benign]
    openings = phases.generate("blue", [Request("blue", blue_messages(x)) for _, x, _ in asked],
                               Sampling(max_new_tokens=k, temperature=0.0))
    rows = []
    for (basic, x, kind), (c, *_) in zip(asked, openings):
        own = list(c.token_ids)[:k]
        if not own or own == refusal or (kind == "benign" and refused(c.text)):
            continue  # nothing to choose between, or a benign request the base itself refused
        rows.append({"basic": basic, "asked": x, "kind": kind, "opening": c.text, "opening_ids": own,
                     "refusal_ids": refusal, "iteration": iteration})
    metrics = {"decision_pairs": float(len(rows))}
    for kind in ("harmful", "benign"):
        mine = sum(a[2] == kind for a in asked)
        if mine:
            metrics[f"decision_{kind}_kept_share"] = sum(r["kind"] == kind for r in rows) / mine
    return rows, metrics


def decision_examples(rows: list[dict], prompts: list[list[int]]) -> list[ChoiceExample]:
    """Each row's two openings under blue's own prompt (`prompts`: its
    encoded chat): the refusal gold where the request is harmful, blue's own
    opening where it is benign."""
    return [ChoiceExample(ids, [x["refusal_ids"], x["opening_ids"]], 0 if x["kind"] == "harmful" else 1, x["kind"])
            for x, ids in zip(rows, prompts)]
