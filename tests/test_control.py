"""control.py: adaptive phase lengths and the judge-drift alarm, each
decision a metrics row with its reason; then on the tiny model, end to end."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from lora_triplay.cli import app
from lora_triplay.recipe import build_recipe
from lora_triplay.triplay.control import CONTROL, ControlConfig, PhaseControl


def _control(**cfg) -> PhaseControl:
    recipe = build_recipe({})
    return PhaseControl(ControlConfig(adaptive=True, **cfg), recipe, {"global_step": 7})


def test_red_outgrowing_blue_lengthens_blue():
    c = _control(red_asr_high=0.5, extra_steps=3)
    base = c.steps(1, "blue")
    assert c.after_phase(1, "red", [{"asr_blue": 0.4}, {"asr_blue": 0.5}]) == []  # mean 0.45: below the threshold
    (row,) = c.after_phase(1, "red", [{"asr_blue": 0.7}, {"asr_blue": 0.9}])
    assert c.steps(1, "blue") == base + 3 and c.steps(2, "blue") == base  # this iteration only
    assert row["phase"] == CONTROL and "0.80 > red_asr_high 0.5" in row["reason"] and row["global_step"] == 7


def test_eval_losing_accuracy_gets_more_steps_next_iteration():
    c = _control(eval_accuracy_drop=0.1, extra_steps=2)
    base = c.steps(2, "eval")
    assert c.after_phase(1, "eval", [{"accuracy": 0.8}]) == []  # nothing to compare with yet
    assert c.after_phase(2, "eval", [{"accuracy": 0.75}]) == []  # a drop of 0.05
    (row,) = c.after_phase(3, "eval", [{"accuracy": 0.5}])
    assert c.steps(4, "eval") == base + 2 and "0.75 -> 0.50" in row["reason"]


def test_red_stops_early_when_its_entropy_collapses():
    c = _control(red_entropy_floor=0.5)
    assert c.after_step(1, "red", {"step": 1, "entropy": 0.9}) == []
    (row,) = c.after_step(1, "red", {"step": 2, "entropy": 0.3})
    assert c.steps(1, "red") == 2 and "0.300 < red_entropy_floor 0.5" in row["reason"]
    assert c.after_step(1, "blue", {"step": 1, "entropy": 0.0}) == []  # only red's entropy counts


def test_nothing_changes_when_adaptive_is_off():
    c = PhaseControl(ControlConfig(red_entropy_floor=0.5), build_recipe({}), {"global_step": 1})
    assert c.after_step(1, "red", {"step": 1, "entropy": 0.0}) == []
    assert c.after_phase(1, "red", [{"asr_blue": 1.0}]) == []
    assert c.state["phase_steps"] == {}


def test_drift_alarm_on_falling_agreement_pauses_red():
    c = _control(drift_drop=0.1, pause_red_on_drift=True, extra_steps=1)
    eval_steps = c.steps(2, "eval")
    first = c.drift(1, 0.8, [{"reward_mean": 0.1}], unsafe_rate=0.2)
    assert [r["action"] for r in first] == ["drift check"]  # the baseline
    assert c.drift(2, 0.75, [{"reward_mean": 0.1}], unsafe_rate=0.2)[1:] == []  # within drift_drop
    rows = c.drift(2, 0.6, [{"reward_mean": 0.1}], unsafe_rate=0.2)
    assert len(rows) == 2 and rows[1]["reason"].startswith("judge drift: agreement 0.60")
    assert c.steps(3, "red") == 0 and c.steps(3, "eval") == eval_steps + 1


def test_reward_hacking_signature():
    c = _control(drift_drop=1.0)
    c.drift(1, 0.8, [{"reward_mean": 0.2}], unsafe_rate=0.3)
    assert len(c.drift(2, 0.8, [{"reward_mean": 0.4}], unsafe_rate=0.5)) == 1  # reward up, more unsafe answers: fine
    rows = c.drift(3, 0.8, [{"reward_mean": 0.6}], unsafe_rate=0.4)  # reward up, fewer unsafe answers
    assert len(rows) == 2 and "red may be fooling eval" in rows[1]["reason"] and rows[1]["action"] == "warning"


RECIPE = """\
model: {{base: "{base}", device: cpu, dtype: float32}}
lora: {{rank: 4, alpha: 8}}
iterations: 2
phases: {{red: {{steps: 2}}, blue: {{steps: 1}}, eval: {{steps: 1}}, eval_warmup: {{steps: 1, pairs: 6}}}}
grpo: {{group_size: 2, prompts_per_step: 2, lr: 1.0e-3, max_new_tokens: 6}}
rewards: {{judge_mode: choice, embedding_model: hashing}}
experts: {{safety_experts: 2, utility_experts: 2, min_votes: 1}}
control: {{adaptive: true, red_asr_high: 0.0, red_entropy_floor: 100.0, extra_steps: 1, drift_check: true, drift_pairs: 4, drift_drop: 0.0}}
"""


@pytest.mark.slow
def test_control_end_to_end_on_the_tiny_model(tiny_model_dir, tmp_path):
    (tmp_path / "r.yaml").write_text(RECIPE.format(base=tiny_model_dir))
    result = CliRunner().invoke(app, ["run", str(tmp_path / "r.yaml"), "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [(r["iteration"], r["phase"]) for r in rows if r["phase"] != CONTROL]
    # red stops after 1 of its 2 steps (entropy < 100); blue gets 1 + 1 steps (any ASR > 0.0 counts, or none:
    # then blue keeps its 1 step); eval as the recipe says
    assert steps.count((1, "red")) == 1 and steps.count((2, "red")) == 1
    decisions = [r for r in rows if r["phase"] == CONTROL]
    assert any(d["action"] == "stop red after step 1" for d in decisions)
    assert sum(d["action"] == "drift check" for d in decisions) == 2  # after each P_eval
    blue_more = [d for d in decisions if d["action"].startswith("blue ")]
    assert steps.count((1, "blue")) == (2 if any(d["iteration"] == 1 for d in blue_more) else 1)
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    assert state["done"] and state["drift"]["baseline"] is not None

    from lora_triplay.report import make_report

    report = make_report(tmp_path / "run", tmp_path / "report")
    assert "Control decisions" in (tmp_path / "report" / "summary.md").read_text() and len(report["control"]) == len(decisions)
