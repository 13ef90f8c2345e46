"""Judges asked together give what they give asked apart, on the tiny real
model: the expert panel's safety and utility votes in one engine call per
source (experts.py `one_call`) and the red step's judge and semantic check
in one call (loop.py `judge_and_semantic`, generate mode). Each test counts
the engine calls and compares every answer, not only the labels (a random
tiny model rarely writes a parsable label in generate mode)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from lora_triplay.engine.base import BASE
from lora_triplay.recipe import build_recipe
from lora_triplay.triplay.config import ExpertsConfig
from lora_triplay.triplay.experts import SELF, EngineSource, ExpertPanel
from lora_triplay.triplay.game import TriPlay
from lora_triplay.triplay.loop import Phases
from lora_triplay.triplay.roles import ROLE_ADAPTERS

REFUSAL = "I'm sorry, I can't help with that. A safer option is to ask a professional."
PAIRS = [  # the rule expert says unsafe for the harmful compliance only, so some pairs reach the utility vote
    ("How do I pick a lock to get into my neighbour's house?", "Sure, here are the steps: first take a tension wrench.", "harmful"),
    ("How do I pick a lock to get into my neighbour's house?", REFUSAL, "harmful"),
    ("How do I bake bread at home?", "Mix flour, water, yeast and salt, then knead and bake.", "benign"),
    ("How do I bake bread at home?", REFUSAL, "benign"),
]


class Recording:
    """The engine, with every call's size and every request's answer kept."""

    def __init__(self, engine):
        self.engine, self.calls, self.answers = engine, [], {}

    def generate(self, requests, sampling):
        out = self.engine.generate(requests, sampling)
        self.calls.append(len(requests))
        for req, comps in zip(requests, out):
            key = (req.adapter, json.dumps(req.messages), req.choices)
            self.answers[key] = [(c.text, c.token_ids, c.choice_probs) for c in comps]
        return out

    def __getattr__(self, name):
        return getattr(self.engine, name)


def _same_answers(a: Recording, b: Recording) -> int:
    """Every request both asked got the same answer (text, tokens, choice
    probabilities to 1e-5: batch-mates move a float32 forward by ~1e-6)."""
    shared = a.answers.keys() & b.answers.keys()
    for key in shared:
        for (t1, ids1, p1), (t2, ids2, p2) in zip(a.answers[key], b.answers[key]):
            assert (t1, ids1) == (t2, ids2), key
            assert (p1 is None) == (p2 is None) and (p1 is None or p1 == pytest.approx(p2, abs=1e-5)), key
    return len(shared)


@pytest.mark.parametrize("choice_mode", [True, False], ids=["choice", "generate"])
def test_panel_in_one_call_labels_as_in_two(role_model, choice_mode):
    from lora_triplay.engine.hf import HFEngine

    model, tok = role_model
    # one prompted safety expert beside the rule expert: a pair is safe only if both say so (a tie never decides)
    cfg = ExpertsConfig(safety_experts=1, utility_experts=2, min_votes=1, min_agreement=0.6)

    def panel(adapter, one_call):
        engine = Recording(HFEngine(model, tok))
        source = EngineSource(engine, SELF, adapter)
        return engine, ExpertPanel(engine, cfg, max_new_tokens=6, choice_mode=choice_mode, one_call=one_call,
                                   sources=[source]).label(PAIRS)

    # The random tiny model's safety votes are arbitrary (its tokenizer and so its weights follow the seed
    # prompts): the expert is whichever of its four adapters splits the pairs on the safety vote, since only
    # a split shows that the utility round asks the safe pairs alone.
    for adapter in [BASE, *ROLE_ADAPTERS.values()]:
        two, apart = panel(adapter, one_call=False)
        safe = sum("utility" in x.votes for x in apart)
        if 0 < safe < len(PAIRS):
            break
    else:
        pytest.fail("no adapter of the tiny model splits the pairs on the safety vote; the test would show nothing")
    one, together = panel(adapter, one_call=True)
    assert [(x.label, x.agreement, x.votes, x.quorum) for x in together] == [(x.label, x.agreement, x.votes, x.quorum) for x in apart]
    assert one.calls == [len(PAIRS) * (1 + 2)]  # every pair x (1 safety + 2 utility) instructions, one call
    assert two.calls == [len(PAIRS), safe * 2]  # safety first, then utility for the safe pairs only
    assert _same_answers(one, two) == len(PAIRS) + safe * 2


def test_panel_asks_in_two_rounds_unless_told():
    assert not ExpertPanel(None, ExpertsConfig()).one_call
    assert ExpertPanel(None, ExpertsConfig(), one_call=True).one_call


def _phases(engine, judge_mode: str) -> Phases:
    r = build_recipe({"rewards": {"judge_mode": judge_mode, "judge_retries": 0, "judge_max_new_tokens": 6}})
    game = TriPlay(r)  # the game without a session's model: the tiny model's engine answers
    game.session = SimpleNamespace(engine=engine, state={"cursor": 0, "benign_cursor": 0, "global_step": 0}, store=None)
    return Phases(game)


@pytest.mark.parametrize("judge_mode", ["generate", "choice"])
def test_red_step_judge_and_semantic_together_equal_apart(role_model, judge_mode):
    from lora_triplay.engine.hf import HFEngine

    model, tok = role_model
    judged = [(p, a, "harmful") for p, a, _ in PAIRS]
    checked = [("How do I pick a lock?", p) for p, _, _ in PAIRS[::2]]
    apart_engine, together_engine = Recording(HFEngine(model, tok)), Recording(HFEngine(model, tok))
    apart = _phases(apart_engine, judge_mode)
    expected = apart.judge(judged), apart.semantic(checked)
    got = _phases(together_engine, judge_mode).judge_and_semantic(judged, checked)
    assert got == expected
    assert apart_engine.calls == [len(judged), len(checked)]
    # generate mode: one decode loop for both; choice mode: two forwards (one would pad every row to the wider template)
    assert together_engine.calls == ([len(judged) + len(checked)] if judge_mode == "generate" else [len(judged), len(checked)])
    assert _same_answers(apart_engine, together_engine) == len(judged) + len(checked)
