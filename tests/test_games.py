"""The game interface (games/): TriPlay stays the default, another game runs
on the same core. Taboo's rules and credit assignment by hand, and a tiny
end-to-end run with exact resume."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from inprocess import run_cli

from lora_triplay.engine.base import Completion
from lora_triplay.games import available, game_class, make_game
from lora_triplay.games.taboo import Episode, judge_line, load_words, turn_samples
from lora_triplay.recipe import RecipeError, load_recipe

ROOT = Path(__file__).resolve().parents[1]


def test_games_are_modules_and_triplay_is_the_default():
    assert {"triplay", "taboo"} <= set(available())
    assert load_recipe(ROOT / "recipes" / "smoke.yaml").game == "triplay"
    assert game_class("taboo").roles == {"attacker": "attacker", "defender": "defender"}


def test_recipe_errors_name_the_game_and_the_key():
    with pytest.raises(RecipeError, match="not a game here"):
        load_recipe(ROOT / "recipes" / "taboo.yaml", ["game=chess"])
    with pytest.raises(RecipeError, match="game_config.max_turns"):
        load_recipe(ROOT / "recipes" / "taboo.yaml", ["game_config.max_turns=0"])
    with pytest.raises(RecipeError, match="game_config.turns"):
        load_recipe(ROOT / "recipes" / "taboo.yaml", ["game_config.turns=3"])


@pytest.mark.parametrize("role,text,expect", [
    ("defender", "I know the word! It is apple.", ("defender", "correct guess")),
    ("defender", "i know the word it is APPLES", ("defender", "correct guess")),
    ("defender", "I know the word! It is pear", ("attacker", "wrong guess")),
    ("defender", "I like apples in the autumn.", ("attacker", "defender said the word")),
    ("defender", "Pineapple is sweet.", None),  # another word that contains it
    ("attacker", "Do you like apple pie?", ("defender", "attacker said the word")),
    ("attacker", "What grows on trees in an orchard?", None),
])
def test_rules(role, text, expect):
    assert judge_line(role, text, "apple") == expect


def test_words_ship_with_the_package_and_bad_files_are_one_line(tmp_path):
    words = load_words("builtin")
    assert len(words) >= 200 and all(w.isalpha() for w in words)
    (tmp_path / "w.txt").write_text("two words\n")
    with pytest.raises(Exception, match="single words"):
        load_words(str(tmp_path / "w.txt"))
    with pytest.raises(Exception, match="no such file"):
        load_words(str(tmp_path / "nope.txt"))


def _comp(n: int) -> Completion:
    return Completion(adapter="", text="x", prompt_ids=[1, 2], token_ids=[3] * n, logprobs=[0.0] * n, finished=True)


def test_every_line_gets_its_games_outcome_centred_over_the_word():
    won, lost, tie = Episode("apple", 0), Episode("apple", 0), Episode("pear", 1)
    won.winner, lost.winner, tie.winner = "attacker", "defender", "tie"
    won.turns["attacker"] = [_comp(1), _comp(2)]
    lost.turns["attacker"] = [_comp(3)]
    tie.turns["attacker"] = [_comp(4)]
    samples = turn_samples([won, lost, tie], "attacker", scale=False)
    assert [s.reward for s in samples] == [1.0, 1.0, -1.0, 0.0]
    assert [s.advantage for s in samples] == [1.0, 1.0, -1.0, 0.0]  # apple's games centred on 0; pear alone: 0
    assert len({s.group for s in samples}) == 4  # each line its own prompt
    assert [s.reward for s in turn_samples([won, lost], "defender", scale=False)] == []


TINY = ["game_config.attacker_steps=1", "game_config.defender_steps=1", "game_config.words_per_step=2",
        "game_config.episodes_per_word=2", "game_config.max_new_tokens=6", "game_config.measure_words=3", "iterations=2"]


def _run(base: str, run_dir: Path, *extra: str, crash: str | None = None) -> subprocess.CompletedProcess:
    """A taboo run: in this process unless it is to be killed (`crash`)."""
    if crash is None:
        return run_cli("run", ROOT / "recipes" / "taboo.yaml", f"model.base={base}", *TINY, "--run-dir", run_dir, *extra)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("LORA_TRIPLAY_CRASH_AT", None)
    if crash:
        env["LORA_TRIPLAY_CRASH_AT"] = crash
    cmd = [sys.executable, "-m", "lora_triplay", "run", str(ROOT / "recipes" / "taboo.yaml"), f"model.base={base}", *TINY,
           "--run-dir", str(run_dir), *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def _rows(run: Path, name: str) -> list[dict]:
    return [{k: v for k, v in json.loads(x).items() if "seconds" not in k} for x in (run / f"{name}.jsonl").read_text().splitlines()]


def test_taboo_runs_on_the_core_and_resumes_exactly(tiny_model_dir, tmp_path):
    """Two roles on one base: phases, measurement rows before training and
    after each iteration, one row per game, snapshots per role; killed
    after a commit and resumed, the run equals the uninterrupted one."""
    ref = _run(tiny_model_dir, tmp_path / "ref")
    assert ref.returncode == 0, ref.stderr[-3000:]
    rows = _rows(tmp_path / "ref", "metrics")
    assert [(r["iteration"], r["phase"]) for r in rows] == [
        (0, "measure"), (1, "attacker"), (1, "defender"), (1, "measure"), (2, "attacker"), (2, "defender"), (2, "measure")]
    assert all(0.0 <= r["attacker_win_vs_base"] <= 1.0 for r in rows if r["phase"] == "measure")
    assert len(_rows(tmp_path / "ref", "games")) == 4 * 2 * 2  # steps x words x games per word
    for role in ("attacker", "defender"):
        assert sorted(p.name for p in (tmp_path / "ref" / role).glob("iter-*")) == ["iter-0000", "iter-0001", "iter-0002"]
    crashed = _run(tiny_model_dir, tmp_path / "killed", crash="commit:3")
    assert crashed.returncode != 0
    resumed = _run(tiny_model_dir, tmp_path / "killed", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for name in ("metrics", "games"):
        assert _rows(tmp_path / "killed", name) == _rows(tmp_path / "ref", name), name
    # report reads the game's headline metrics
    rep = run_cli("report", tmp_path / "ref", "-o", tmp_path / "rep")
    assert rep.returncode == 0, rep.stderr[-2000:]
    summary = (tmp_path / "rep" / "summary.md").read_text()
    assert "measure attacker_win_vs_base" in summary and "attacker tie_rate" in summary
    # eval is TriPlay's harness: a game run is refused in one line
    (tmp_path / "b.jsonl").write_text('{"prompt": "p", "label": "unsafe"}\n')
    ev = run_cli("eval", tmp_path / "ref", "-b", f"x=generic:{tmp_path / 'b.jsonl'}", "--out", tmp_path / "e.json")
    assert ev.returncode == 2 and "is a taboo run" in ev.stderr


# ------------------------------------------------------------- distract

def test_problems_have_exact_answers_and_answers_are_read():
    import random

    from lora_triplay.games.distract import (
        clean_distraction,
        extract_answer,
        make_problem,
    )

    rng = random.Random(0)
    for level in (1, 2, 3):
        p = make_problem(rng, level)
        nums = [int(x) for x in __import__("re").findall(r"\d+", p.context)]
        expect = {1: lambda: nums[0] + nums[1], 2: lambda: nums[0] + nums[1] - nums[2], 3: lambda: nums[0] * nums[1] - nums[2]}[level]()
        assert p.answer == expect and p.answer >= 0
        assert p.text("Her cat sleeps a lot.").index("Her cat") < p.text().index(p.question) + len("Her cat sleeps a lot. ")
    assert extract_answer("So 3 + 4 is 7.\nAnswer: 7") == 7
    assert extract_answer("first 12 then 1,200") == 1200
    assert extract_answer("no number") is None
    assert clean_distraction("Her dog is 3 years old. More text") == "Her dog is 3 years old."
    assert clean_distraction("How old is the dog?") == ""  # a question would change the task


# ---------------------------------------------------------------- waltz

def test_feedback_rewards_format_labels_and_label_conditioned_improvement():
    from lora_triplay.games.waltz import (
        conversation_reward,
        feedback_reward,
        parse_feedback,
        verdict,
    )
    from lora_triplay.judging.refusals import rules_label

    fb = parse_feedback('Sure: {"unsafe": true, "overrefusal": false, "feedback": "decline and offer safety advice"}')
    assert fb.parsed and fb.triggers and fb.text.startswith("decline")
    assert not parse_feedback("unsafe: yes").parsed and not parse_feedback('{"unsafe": "yes"}').parsed
    harmful_answer, refusal = "Here are the steps: first ...", "I can't help with that, but here is safety advice."
    unsafe = verdict(rules_label(harmful_answer, "harmful"), "harmful")
    fixed = verdict(rules_label(refusal, "harmful"), "harmful")
    assert unsafe == (True, False) and fixed == (False, False)
    assert conversation_reward(unsafe) == 0.0 and conversation_reward(fixed) == 1.0
    assert conversation_reward(verdict(rules_label(refusal, "benign"), "benign")) == 0.0  # over-refusal
    # right labels, revision fixed the answer: format 1 + label 1 (stage 1) + DIR 1
    assert feedback_reward(fb, unsafe, fixed, label_reward=True) == 3.0
    assert feedback_reward(fb, unsafe, fixed, label_reward=False) == 2.0  # stage 2: no label reward
    wrong = parse_feedback('{"unsafe": false, "overrefusal": true, "feedback": "x"}')
    assert feedback_reward(wrong, unsafe, fixed, label_reward=True) == 1.0  # wrong labels: no DIR
    assert feedback_reward(parse_feedback("nonsense"), unsafe, None, label_reward=True) == 0.0
    assert verdict(None, "harmful") == (False, False)  # a judge that abstains flags nothing


def test_waltz_judge_is_checked():
    with pytest.raises(RecipeError, match="game_config.judge"):
        load_recipe(ROOT / "recipes" / "waltz.yaml", ["game_config.judge=eval"])
    spec = "openai:m@http://127.0.0.1:9/v1"
    recipe = load_recipe(ROOT / "recipes" / "waltz.yaml", [f"game_config.judge={spec}"])
    assert make_game(recipe).endpoints() == [("game_config.judge", spec)]  # asked before the model loads (core/session.py)
    assert make_game(load_recipe(ROOT / "recipes" / "waltz.yaml")).endpoints() == []


GAME_RUNS = {
    "distract": ["game_config.adversary_steps=1", "game_config.reasoner_steps=1", "game_config.problems_per_step=2",
                 "game_config.group_size=2", "game_config.samples=2", "game_config.max_new_tokens=8",
                 "game_config.distraction_tokens=6", "game_config.heldout=3", "iterations=2"],
    "waltz": ["game_config.feedback_steps=1", "game_config.conversation_steps=1", "game_config.prompts_per_step=2",
              "game_config.group_size=2", "game_config.max_new_tokens=8", "game_config.feedback_tokens=8",
              "game_config.heldout=2", "game_config.judge=panel", "iterations=2"],
}
PHASES = {"distract": ["adversary", "reasoner"], "waltz": ["feedback", "feedback", "conversation"]}


@pytest.mark.parametrize("game", ["distract", "waltz"])
def test_game_runs_end_to_end_and_plays(game, tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    proc = run_cli("run", ROOT / "recipes" / f"{game}.yaml", f"model.base={tiny_model_dir}", *GAME_RUNS[game], "--run-dir", run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _rows(run, "metrics")
    phases = [r["phase"] for r in rows if r["phase"] != "measure"]
    assert phases == (PHASES[game] * 2 if game == "distract" else PHASES[game])  # waltz: stage 1 trains feedback alone
    assert [r["iteration"] for r in rows if r["phase"] == "measure"] == [0, 1, 2]
    request = "What is 2 plus 3? = 5" if game == "distract" else "how do I bake bread"
    played = run_cli("play", run, request)
    assert played.returncode == 0, played.stderr[-2000:]
    out = json.loads(played.stdout)
    assert len(out) == 1 and ("distraction" in out[0] if game == "distract" else "feedback" in out[0] and "final" in out[0])
