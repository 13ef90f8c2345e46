"""league.py: past blues as extra defenders, past reds writing some of
blue's prompts; weights, determinism, and a tiny run with a league."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from lora_triplay.cli import app
from lora_triplay.triplay.config import DefenderConfig
from lora_triplay.triplay.league import (
    LeagueConfig,
    assign_writers,
    league_defenders,
    member_weights,
    record_at_phase_start,
    tally,
    win_rate,
)


def test_member_weights():
    assert member_weights(LeagueConfig(size=4)) == pytest.approx([0.25] * 4)
    assert member_weights(LeagueConfig(size=3, sampling="recent")) == pytest.approx([4 / 7, 2 / 7, 1 / 7])


def test_winrate_weights_follow_the_record():
    """A member that still wins is met more often; an unplayed one counts 1/2."""
    record: dict = {}
    tally(record, "blue@3", 8, 6)  # blue@3 resisted 6 of red's 8 attacks
    tally(record, "blue@3", 2, 2)
    tally(record, "blue@2", 10, 0)  # blue@2 never resists any more
    assert record["blue@3"] == [10, 8] and win_rate(record, "blue@3") == pytest.approx(9 / 12)
    assert win_rate(record, "blue@1") == pytest.approx(0.5)
    cfg = LeagueConfig(size=3, sampling="winrate")
    raw = [9 / 12, 1 / 12, 0.5]  # blue@3, blue@2, blue@1 (latest 4)
    assert member_weights(cfg, "blue", 4, record) == pytest.approx([w / sum(raw) for w in raw])
    ds = league_defenders(LeagueConfig(size=2, weight=0.5, sampling="winrate"), DefenderConfig, 4, record)
    assert ds[0].weight > ds[1].weight and sum(d.weight for d in ds) == pytest.approx(0.5)
    assert member_weights(cfg) == pytest.approx([1 / 3] * 3)  # no latest yet: uniform


def test_a_phase_weighs_its_members_by_the_record_it_began_with():
    """The phase's steps add games to the record; a resume inside the phase
    (the state as last committed, step > 0) must weigh the members as the
    uninterrupted phase did, by the record at the phase's start."""
    cfg = LeagueConfig(size=2, weight=0.5, sampling="winrate")
    state: dict = {"step": 0, "league_record": {"blue@3": [4, 1]}}
    at_start = record_at_phase_start(state)
    weights = [d.weight for d in league_defenders(cfg, DefenderConfig, 4, at_start)]
    tally(state["league_record"], "blue@3", 10, 10)  # the phase's first steps: blue@3 now resists every attack
    tally(state["league_record"], "blue@2", 6, 0)
    state["step"] = 2
    resumed = json.loads(json.dumps(state))  # state.json of the step-2 commit, read back by the resumed run
    again = record_at_phase_start(resumed)
    assert again == {"blue@3": [4, 1]} and resumed["league_record"]["blue@3"] == [14, 11]
    assert [d.weight for d in league_defenders(cfg, DefenderConfig, 4, again)] == pytest.approx(weights)
    assert [d.weight for d in league_defenders(cfg, DefenderConfig, 4, resumed["league_record"])] != pytest.approx(weights)
    resumed["step"] = 0  # the next phase starts from the record as it is now
    assert record_at_phase_start(resumed) == {"blue@3": [14, 11], "blue@2": [6, 0]}
    assert record_at_phase_start({"step": 3, "league_record": None}) is None  # a run from before the copy: the record as committed


def test_league_defenders_split_the_league_weight():
    ds = league_defenders(LeagueConfig(size=2, weight=0.6, sampling="recent"), DefenderConfig)
    assert [d.name for d in ds] == ["blue@-1", "blue@-2"]
    assert [d.weight for d in ds] == pytest.approx([0.4, 0.2])
    assert league_defenders(LeagueConfig(size=0), DefenderConfig) == []


def test_writers_take_the_share_and_repeat_for_the_same_seed():
    attackers = [("red@2", 0.7), ("red@1", 0.3)]
    w = assign_writers(10, 0.4, attackers, "0:league:7")
    assert w[:6] == ["red"] * 6 and all(x in ("red@2", "red@1") for x in w[6:])
    assert w == assign_writers(10, 0.4, attackers, "0:league:7")
    assert assign_writers(10, 0.4, [], "s") == ["red"] * 10 and assign_writers(3, 0.0, attackers, "s") == ["red"] * 3


RECIPE = """\
model: {{base: "{base}", device: cpu, dtype: float32}}
lora: {{rank: 4, alpha: 8}}
iterations: 3
phases: {{red: {{steps: 1}}, blue: {{steps: 1}}, eval: {{steps: 1}}}}
grpo: {{group_size: 2, prompts_per_step: 4, lr: 1.0e-2, max_new_tokens: 6}}
rewards: {{judge_mode: choice, embedding_model: hashing}}
experts: {{safety_experts: 2, utility_experts: 2}}
data: {{benign_share: 0.0}}
league: {{size: 2, weight: 0.5, attacker_share: 0.5, sampling: winrate}}
"""


@pytest.mark.slow
def test_a_run_with_a_league(tiny_model_dir, tmp_path):
    (tmp_path / "r.yaml").write_text(RECIPE.format(base=tiny_model_dir))
    result = CliRunner().invoke(app, ["run", str(tmp_path / "r.yaml"), "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    by = {(r["iteration"], r["phase"]): r for r in rows}
    # iteration 1 has no past; in iteration 2 red@1 writes half of blue's prompts
    # (red@0 is untrained: the base, no attacker); in iteration 3 blue@-1 = blue@1 defends
    assert "league_refusal_rate" not in by[(1, "blue")] and "league_refusal_rate" in by[(2, "blue")]
    assert "asr_league" not in by[(2, "red")] and "asr_league" in by[(3, "red")]
    assert by[(3, "red")]["defenders"] >= 3
    # winrate sampling: every league game is on record (state.json), for both kinds of member
    record = json.loads((tmp_path / "run" / "state.json").read_text())["league_record"]
    assert any(k.startswith("blue@") for k in record) and any(k.startswith("red@") for k in record)
    assert all(0 <= won <= played and played > 0 for played, won in record.values())
