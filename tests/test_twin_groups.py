"""phases.blue.twin_groups: a blue step's harmful seed requests bring their
benign topic twins, and each twin's answers share its seed's GRPO group, so
a refused twin scores below a refused harmful request even where each
wording's own group is flat. Through the real phase code with the scripted
engine of test_method_fixes (the model is not the point here)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from lora_triplay.errors import UserError
from lora_triplay.recipe import build_recipe
from lora_triplay.triplay.rundata import RunData
from tests.test_method_fixes import Scripted, _session

ROOT = Path(__file__).resolve().parents[1]

REFUSAL = "I cannot help with that."


def test_builtin_twins_name_seed_requests_and_come_with_their_seeds():
    r = build_recipe({"data": {"benign_share": 0.5}, "phases": {"blue": {"twin_groups": True}}})
    state = {"cursor": 0, "benign_cursor": 0, "global_step": 0}
    data = RunData(r, state, panel=None)
    seeds = {b.id: b for b in data.basic}
    assert len(data.twin_of_seed) == 40 and set(data.twin_of_seed) <= set(seeds)
    assert all(t.id.startswith("benign-topic_twin-") for t in data.twin_of_seed.values())
    # hand-checked pairs: the same topic, the benign wording
    assert data.twin_of_seed["cyber-01"].prompt.startswith("Explain how to secure my own email account")
    assert "hurting" in data.twin_of_seed["selfharm-01"].prompt
    for _ in range(5):
        cursor = state["benign_cursor"]
        harmful, benign = data.blue_requests(8, twins=True)
        twins = [data.twin_of_seed[b.id] for b, _ in harmful if b.id in data.twin_of_seed]
        twins = list({t.id: t for t in twins}.values())[:4]
        assert benign[: len(twins)] == twins  # the step's own twins first
        assert len(benign) == 4 and state["benign_cursor"] == cursor + 4 - len(twins)  # the stream fills the rest


def test_a_benign_file_names_its_twins_and_a_wrong_name_is_refused(tmp_path):
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("\n".join(json.dumps({"id": f"h{i}", "prompt": f"harmful request {i}"}) for i in range(3)) + "\n")
    benign = tmp_path / "benign.jsonl"
    rows = [{"id": "b0", "prompt": "benign twin of 1", "twin_of": "h1"}, {"id": "b1", "prompt": "a benign request"}]
    benign.write_text("\n".join(json.dumps(x) for x in rows) + "\n")
    data = {"basic_prompts": str(seeds), "benign_prompts": str(benign), "benign_share": 0.5}
    got = RunData(build_recipe({"data": data}), {"cursor": 0, "benign_cursor": 0, "global_step": 0}, panel=None)
    assert {k: v.id for k, v in got.twin_of_seed.items()} == {"h1": "b0"}
    rows[0]["twin_of"] = "h9"
    benign.write_text("\n".join(json.dumps(x) for x in rows) + "\n")
    with pytest.raises(UserError, match="twin_of names no seed request.*b0: h9"):
        RunData(build_recipe({"data": data}), {"cursor": 0, "benign_cursor": 0, "global_step": 0}, panel=None)
    # twin groups with no twin at all (the builtin benign requests beside another seed set) would do nothing: refused
    data = {"basic_prompts": str(seeds), "benign_share": 0.5}
    with pytest.raises(UserError, match="twin_groups: no benign request is the twin"):
        RunData(build_recipe({"data": data, "phases": {"blue": {"twin_groups": True}}}),
                {"cursor": 0, "benign_cursor": 0, "global_step": 0}, panel=None)


def test_twin_groups_are_refused_where_they_cannot_work():
    with pytest.raises(ValueError, match="twin_groups.*data.benign_share > 0"):
        build_recipe({"phases": {"blue": {"twin_groups": True}}})
    with pytest.raises(ValueError, match="only blue answers benign twins"):
        build_recipe({"data": {"benign_share": 0.5}, "phases": {"red": {"twin_groups": True}}})


@pytest.mark.parametrize("twin_groups", [True, False])
def test_a_refused_twin_scores_below_a_refused_harmful_request(twin_groups):
    """Blue refuses everything; eval pays a refusal of a harmful request
    (`positive`, +1) and charges one of a benign request (`rejective`, -1).
    Each wording's own group is flat (one reward), so without twin groups
    nothing is learnt; with them a twin shares its seed's group and its
    refusals get the negative advantage."""
    engine = Scripted(answer=lambda a, p: REFUSAL, label=lambda p, r: "positive" if p.startswith("wrapped:") else "rejective")
    s, phases = _session(engine, phases={"blue": {"twin_groups": twin_groups}}, data={"benign_share": 0.5},
                         rewards={"blue_benign_class_values": {"negative": -1.0, "rejective": -1.0, "positive": 1.0}})
    s.data.basic = [b for b in s.data.basic if b.id in s.data.twin_of_seed]  # every seed has a twin
    result = phases.blue_step(1, 1)
    rows, samples = result.rows["eval_pairs"], result.samples
    harmful_group = {row["basic"]: x.group for x, row in zip(samples, rows) if row["kind"] == "harmful"}
    twin_of = {t.prompt: seed for seed, t in s.data.twin_of_seed.items()}
    seed_text = {b.id: b.prompt for b in s.data.basic}
    benign = [(x, row) for x, row in zip(samples, rows) if row["kind"] == "benign"]
    assert len(benign) == 4 and all(x.reward == -1.0 for x, _ in benign)
    assert all(x.reward == 1.0 for x, row in zip(samples, rows) if row["kind"] == "harmful")
    if twin_groups:
        for x, row in benign:  # each twin in its own seed's group, and pushed down against it
            assert x.group == harmful_group[seed_text[twin_of[row["basic"]]]]
            assert x.advantage < 0 and not x.flat
        assert all(x.advantage > 0 for x, row in zip(samples, rows) if row["kind"] == "harmful")
        assert result.metrics["frac_zero_std"] == 0.0
    else:
        assert all(x.advantage == 0.0 and x.flat for x in samples)
        assert not set(harmful_group.values()) & {x.group for x, _ in benign}


def test_benign_refusals_counts_blue_by_what_it_was_asked(tmp_path, monkeypatch):
    """bench/benign_refusals.py: a twin, another benign request, a seed with a
    twin asked as written and a rewrite; each harmful group's anchored
    refusal is left out once, blue's own answer that opens alike is not."""
    import yaml

    from lora_triplay.triplay.roles import warmup_opening

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from benign_refusals import count_run

    r = build_recipe({"data": {"benign_share": 0.5}, "phases": {"blue": {"refusal_anchor": "guide"}}})
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(r.model_dump(mode="json")))
    data = RunData(r, {"cursor": 0, "benign_cursor": 0, "global_step": 0}, panel=None)
    seed = next(b for b in data.basic if b.id == "cyber-01").prompt
    twin, other = data.twin_of_seed["cyber-01"].prompt, "How do I kill a Python process that has stopped responding?"
    anchor = warmup_opening("guide") + " read about email security."

    def row(kind, basic, wrapped, response):
        return json.dumps({"phase": "blue", "iteration": 1, "step": 1, "kind": kind, "basic": basic, "wrapped": wrapped,
                           "response": response}) + "\n"

    rows = [row("harmful", seed, seed, anchor), row("harmful", seed, seed, anchor), row("harmful", seed, seed, "Sure: first,"),
            row("harmful", seed, "A story: " + seed, anchor), row("harmful", seed, "A story: " + seed, REFUSAL),
            row("benign", twin, twin, REFUSAL), row("benign", twin, twin, "Turn on two-factor sign-in."),
            row("benign", other, other, "Use kill -9 with its process id.")]
    (tmp_path / "eval_pairs.jsonl").write_text("".join(rows))
    got = count_run(tmp_path)["1"]
    assert got["harmful_plain_with_twin"] == {"refused": 1, "answers": 2, "rate": 0.5}
    assert got["harmful_rewrite"] == {"refused": 1, "answers": 1, "rate": 1.0}
    assert got["benign_twin"] == {"refused": 1, "answers": 2, "rate": 0.5}
    assert got["benign_other"] == {"refused": 0, "answers": 1, "rate": 0.0}
    assert got["harmful_plain_no_twin"]["answers"] == 0


def test_an_anchored_refusal_keeps_its_own_requests_advantage(role_model):
    """With refusal_anchor, blue's own answers are measured over twin groups
    but the anchored refusal against its own request's answers (the tiny real
    model answers and judges, forced-choice): pooled, a refusal blue did not
    sample was pushed down by the twins' higher rewards."""
    from lora_triplay.engine.hf import HFEngine
    from lora_triplay.recipe import LoraConfig
    from lora_triplay.training.advantages import group_advantages
    from lora_triplay.triplay.roles import warmup_opening

    model, tok = role_model
    engine = HFEngine(model, tok, lora=LoraConfig(rank=4, alpha=8))
    s, phases = _session(engine, phases={"blue": {"twin_groups": True, "refusal_anchor": "guide", "group_size": 3,
                                                  "max_new_tokens": 5}},
                         rewards={"judge_mode": "choice"}, data={"benign_share": 0.5})
    s.data.basic = [b for b in s.data.basic if b.id in s.data.twin_of_seed]
    result = phases.blue_step(1, 1)
    samples, rows = result.samples, result.rows["eval_pairs"]
    opening = warmup_opening("guide")
    anchors = [i for i, row in enumerate(rows) if row["kind"] == "harmful" and row["response"].startswith(opening)]
    assert len(anchors) == 2  # one per harmful request
    assert len({x.group for x in samples}) == 2  # each harmful request and its twin: one group
    grpo, rewards = s.recipe.grpo, [x.reward for x in samples]
    by_prompt = {p: g for g, p in enumerate(dict.fromkeys(tuple(x.prompt_ids) for x in samples))}
    alone = group_advantages(rewards, [by_prompt[tuple(x.prompt_ids)] for x in samples], grpo.scale_rewards, 1e-4, grpo.min_reward_std)
    pooled = group_advantages(rewards, [x.group for x in samples], grpo.scale_rewards, 1e-4, grpo.min_reward_std)
    for i, x in enumerate(samples):
        assert x.advantage == pytest.approx(alone[i] if i in anchors else pooled[i])
    assert any(alone[i] != pytest.approx(pooled[i]) for i in anchors)  # the rule changed something here
