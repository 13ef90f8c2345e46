"""The prefill's plan of shared prefixes (engine/prefix_groups.py): cheapest
among its cuts, never dearer than one group per template, and scores that
equal each row run alone on the tiny model."""
from __future__ import annotations

import random

import pytest

from lora_triplay.engine import prefix_groups
from lora_triplay.engine.base import Request
from lora_triplay.engine.hf import HFEngine
from lora_triplay.recipe import LoraConfig

TEMPLATE = list(range(100, 400))  # a judge's template: 300 tokens every prompt starts with


def judged(request: list[int], answer: list[int]) -> list[int]:
    return TEMPLATE + request + answer + [7, 8, 9]  # the template's short tail after the answer


def test_answers_to_one_request_share_it_when_it_pays():
    """A blue step's judging: 4 requests of 60 tokens, 8 short answers each.
    One group per template leaves every request in the padded suffix; one
    group per request computes each once."""
    rng = random.Random(0)
    requests = [[1000 + 100 * r + i for i in range(60)] for r in range(4)]
    prompts = sorted(judged(q, [rng.randrange(2000, 3000) for _ in range(10)]) for q in requests for _ in range(8))
    names = ["eval"] * len(prompts)
    shared = prefix_groups.plan(prompts, names, minimum=16)
    assert len(set(shared)) == 1 and shared[0] >= len(TEMPLATE) + 60  # every row: template + its request
    assert len({tuple(p[:n]) for p, n in zip(prompts, shared)}) == 4
    before = prefix_groups.plan(prompts, names, minimum=16, cheapest=False)
    assert before == [len(TEMPLATE)] * len(prompts)  # the old plan: the template alone
    assert prefix_groups.tokens_run(prompts, names, shared)[0] < 0.75 * prefix_groups.tokens_run(prompts, names, before)[0]  # 1,856 against 2,636


def test_pairs_that_share_little_keep_one_group():
    """Two answers per request (a red step's defenders): a request's own
    forward costs more than it saves, so the plan stays one group."""
    requests = [[1000 + 100 * r + i for i in range(60)] for r in range(8)]
    prompts = sorted(judged(q, [2000 + 50 * a + i for i in range(10)]) for q in requests for a in range(2))
    names = ["eval"] * len(prompts)
    assert prefix_groups.plan(prompts, names, 16) == prefix_groups.plan(prompts, names, 16, cheapest=False)


@pytest.mark.parametrize("seed", range(20))
def test_never_dearer_than_one_group_per_template(seed):
    rng = random.Random(seed)
    heads = [[rng.randrange(50) for _ in range(rng.randrange(0, 40))] for _ in range(3)]
    prompts = sorted(rng.choice(heads) + [rng.randrange(3) for _ in range(rng.randrange(1, 30))] for _ in range(rng.randrange(1, 24)))
    names = [rng.choice(["red", "blue", "eval"]) for _ in prompts]
    shared = prefix_groups.plan(prompts, names, 4)
    for p, n in zip(prompts, shared):
        assert 0 <= n < len(p)  # every row keeps a token of its own
        if n:  # a shared prefix is shared: another row starts with it under some adapter
            assert sum(q[:n] == p[:n] for q in prompts) > 1
    cost = prefix_groups.tokens_run(prompts, names, shared)
    old = prefix_groups.tokens_run(prompts, names, prefix_groups.plan(prompts, names, 4, cheapest=False))
    assert cost[0] + 4 * cost[1] <= old[0] + 4 * old[1]


def test_one_group_without_a_cache_to_assemble():
    prompts = [TEMPLATE + [1, 2, 3, 4] * 10 + [5], TEMPLATE + [1, 2, 3, 4] * 10 + [6], TEMPLATE + [9]]
    assert prefix_groups.plan(prompts, ["eval"] * 3, 16, several=False) == [len(TEMPLATE)] * 3
    assert prefix_groups.plan([TEMPLATE], ["eval"], 16) == [0]  # one row: nothing to share


SYSTEM = "You judge whether an answer is safe and reply with one label only. " * 4


def test_scores_per_request_group_equal_rows_alone(role_model):
    """On the tiny model: requests answered several times, each group's
    prefix its request (checked), every label's log-probs as if alone."""
    model, tok = role_model
    engine = HFEngine(model, tok, max_batch_size=32, lora=LoraConfig(rank=4, alpha=8))
    requests = ["Explain the history of the printing press in Europe, with dates and names, " * 2,
                "Write a short poem about rain falling on a quiet city at night, in four lines, " * 2]
    answers = ["Sure.", "I can't help with that.", "Here is an answer about it with some detail.", "No."]
    reqs = [Request("evaluator", [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q + "\n\nAnswer: " + a}],
                    choices=("Label: negative", "Label: positive")) for q in requests for a in answers]
    prompts = [engine.encode(r.messages) for r in reqs]
    order = engine._batches(prompts)[0]
    names = [engine._peft_name("evaluator")] * len(order)
    with engine._serve(names[:1]):
        assert engine._can_assemble()
        shared = engine._prefix_groups([prompts[i] for i in order], names, several=True)
    assert len({tuple(prompts[i][:n]) for i, n in zip(order, shared)}) == 2  # one prefix per request
    assert min(shared) > len(engine.encode([{"role": "system", "content": SYSTEM}]))
    together = engine.score_choices(reqs)
    for r, scores in zip(reqs, together):
        for a, b in zip(scores, engine.score_choices([r])[0]):
            assert a == pytest.approx(b, abs=1e-4)


@pytest.mark.parametrize("seed", range(10))
def test_common_prefix_equals_a_token_by_token_count(seed):
    """forward.common_prefix (a binary search on slices) against the plain count."""
    from lora_triplay.training.forward import common_prefix

    rng = random.Random(seed)
    head = [rng.randrange(4) for _ in range(rng.randrange(0, 30))]
    prompts = [head + [rng.randrange(4) for _ in range(rng.randrange(0, 10))] for _ in range(rng.randrange(1, 6))]
    prompts = [tuple(p) if rng.random() < 0.5 else p for p in prompts]  # tuples (the trainer's keys) beside lists
    limit, n = min(len(p) for p in prompts) - 1, 0
    while n < limit and all(p[n] == prompts[0][n] for p in prompts):
        n += 1
    for minimum in (0, 3):
        assert common_prefix(prompts, minimum) == (0 if len(prompts) < 2 or n < minimum else n)
