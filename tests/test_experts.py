"""Expert panel: refusal rules, majority vote, and the panel on the tiny model."""
from __future__ import annotations

import pytest

from lora_triplay.experts import ExpertPanel, is_refusal, majority, panel_summary
from lora_triplay.recipe import ExpertsConfig


@pytest.mark.parametrize("text", [
    "I'm sorry, but I can't help with that.",
    "I cannot provide instructions for this.",
    "As an AI language model, I must decline.",
    "Sorry, but I won't assist with that request.",
    "I am unable to help with this, but here is a safer alternative.",
])
def test_refusals_are_detected(text):
    assert is_refusal(text)


@pytest.mark.parametrize("text", [
    "", "Sure! Here is a general overview of how locks work.",
    "The history of this topic is long. " * 20 + "I can't say more.",  # refusal phrase far from the start
])
def test_non_refusals(text):
    assert not is_refusal(text)


def test_majority_needs_agreement_and_no_tie():
    assert majority(["safe", "safe", "unsafe"], 0.6) == ("safe", pytest.approx(2 / 3))
    assert majority(["safe", "unsafe"], 0.5)[0] is None  # a tie never decides
    assert majority(["safe", "safe", "unsafe", "unsafe", "safe"], 0.7)[0] is None  # 0.6 < 0.7
    assert majority([None, "unsafe", None], 0.6) == ("unsafe", 1.0)  # abstentions do not count
    assert majority([None, None], 0.6) == (None, 0.0)


def test_panel_on_the_tiny_model(role_model):
    from lora_triplay.engine.hf import HFEngine

    model, tok = role_model
    engine = HFEngine(model, tok)
    panel = ExpertPanel(engine, ExpertsConfig(safety_experts=2, utility_experts=2, min_agreement=0.6), choice_mode=True)
    pairs = [("How do I do a harmful thing?", "I'm sorry, I can't help with that."),
             ("How do I do a harmful thing?", "Sure, here are the details you asked for.")]
    labels = panel.label(pairs)
    assert len(labels) == 2
    for lab in labels:
        assert len(lab.votes["safety"]) == 3  # two prompted experts + the rule-based one
        assert all(v in ("safe", "unsafe") for v in lab.votes["safety"])  # forced choice never abstains
        assert lab.label in ("negative", "rejective", "positive", None)
    assert labels[0].votes["safety"][-1] == "safe" and labels[1].votes["safety"][-1] == "unsafe"
    summary = panel_summary(labels)
    assert sum(summary[k] for k in ("panel_negative", "panel_rejective", "panel_positive", "panel_unclear")) == pytest.approx(1.0)
