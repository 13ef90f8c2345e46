"""Eval's warm start drawn several times (`phases.eval_warmup.draws`,
triplay/eval_draws.py): each draw starts from eval's first weights with an
empty optimizer, the draw the held-out slice ranks first is kept, and a
crash in the middle of the draws resumes exactly."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lora_triplay.recipe import build_recipe
from lora_triplay.triplay.control import phase_steps
from lora_triplay.triplay.eval_draws import best_draw
from lora_triplay.triplay.game import TriPlay

ROOT = Path(__file__).resolve().parents[1]


def _recipe(base: str, **warmup) -> dict:
    return {
        "model": {"base": base, "device": "cpu", "dtype": "float32"}, "lora": {"rank": 4, "alpha": 8}, "iterations": 1,
        "run": {"checkpoint_every": 1},
        "phases": {"red": {"steps": 0}, "blue": {"steps": 0}, "eval": {"steps": 0},
                   "eval_warmup": {"steps": 2, "pairs": 24, "lr": 1e-2, "average_last": 2, **warmup}},
        "grpo": {"group_size": 2, "prompts_per_step": 2, "max_new_tokens": 4},
        "rewards": {"judge_mode": "choice", "embedding_model": "hashing"},
        "experts": {"safety_experts": 0, "utility_experts": 0, "min_votes": 1, "heldout_share": 0.4},
    }


def test_the_recipe_refuses_draws_it_cannot_rank():
    with pytest.raises(ValueError, match="heldout_share"):
        build_recipe({"phases": {"eval_warmup": {"steps": 2, "draws": 3}}, "experts": {"heldout_share": 0}})
    with pytest.raises(ValueError, match="draws"):
        build_recipe({"phases": {"eval_warmup": {"steps": 0, "draws": 3}}})
    with pytest.raises(ValueError, match="draw_enough"):
        build_recipe({"phases": {"eval_warmup": {"steps": 2, "draw_enough": 0.9}}})


def test_each_draw_has_the_phase_schedule_of_its_own():
    """draws x steps updates; the learning-rate decay (lr_end) and tail
    averaging restart with each draw."""
    recipe = build_recipe({"phases": {"eval_warmup": {"steps": 3, "draws": 2, "lr": 1e-3, "lr_end": 5e-4}}})
    game = TriPlay(recipe)
    assert phase_steps(recipe, "eval_warmup") == 6
    assert [round(game.phase_lr("eval_warmup", s, 6), 6) for s in range(1, 7)] == [1e-3, 7.5e-4, 5e-4] * 2
    assert [game.segment("eval_warmup", s, 6) for s in (1, 3, 4, 6)] == [(1, 3), (3, 3), (1, 3), (3, 3)]
    assert game.segment("eval", 4, 6) == (4, 6)


def test_the_best_draw_ranks_by_harmful_recall_then_accuracy_then_order():
    draws = [{"draw": 1, "score": 0.75, "accuracy": 0.99}, {"draw": 2, "score": 1.0, "accuracy": 0.84},
             {"draw": 3, "score": 1.0, "accuracy": 0.90}, {"draw": 4, "score": 1.0, "accuracy": 0.90}]
    assert best_draw(draws)["draw"] == 3
    assert best_draw([{"draw": 1, "score": None, "accuracy": 0.9}, {"draw": 2, "score": 0.0, "accuracy": 0.1}])["draw"] == 2


def _eval_weights(session) -> dict[str, torch.Tensor]:
    from lora_triplay.model import adapter_parameters

    return {k: v.detach().clone() for k, v in adapter_parameters(session.model, session.game.roles["eval"]).items()}


def test_three_draws_keep_the_best_and_draw_one_is_the_plain_warm_start(tiny_model_dir, tmp_path):
    from lora_triplay.core.session import Session
    from lora_triplay.model import adapter_parameters

    plain = Session.open(build_recipe(_recipe(tiny_model_dir)), tmp_path / "plain")
    plain.run()
    session = Session.open(build_recipe(_recipe(tiny_model_dir, draws=3)), tmp_path / "draws")
    start = _eval_weights(session)
    others = {r: {k: v.detach().clone() for k, v in adapter_parameters(session.model, session.game.roles[r]).items()}
              for r in ("red", "blue")}
    session.run()
    run = tmp_path / "draws"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["phase"] == "eval_warmup"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    assert [r.get("tail_averaged_steps") for r in steps] == [None, 2, None, 2, None, 2]  # each draw ends on its own mean
    checks = [r for r in rows if r["phase"] == "eval_heldout" and "draw" in r]
    assert [c["draw"] for c in checks] == [1, 2, 3]
    (decision,) = [r for r in rows if r["phase"] == "eval_draws"]
    entries = [{"draw": c["draw"], "score": c.get("recall_harmful_negative"), "accuracy": c["accuracy"]} for c in checks]
    assert decision["kept"] == best_draw(entries)["draw"] and decision["drawn"] == 3
    drawn = {k: load_file(str(run / "eval_draws" / f"draw-{k}.safetensors")) for k in (1, 2, 3)}
    first = load_file(str(run / "eval_draws" / "start.safetensors"))
    assert all(torch.equal(first[k], start[k]) for k in start)
    # draw 1 is the one-draw warm start, bit for bit; the others learnt other batches from the same start
    assert all(torch.equal(drawn[1][k], _eval_weights(plain)[k]) for k in start)
    assert any(not torch.equal(drawn[1][k], drawn[2][k]) for k in start)
    final = _eval_weights(session)
    assert all(torch.equal(final[k], drawn[decision["kept"]][k]) for k in start)
    for role, before in others.items():
        assert all(torch.equal(v, before[k]) for k, v in adapter_parameters(session.model, session.game.roles[role]).items())
    reopened = Session.open(build_recipe(_recipe(tiny_model_dir, draws=3)), run, resume=True)  # the phase's checkpoint
    assert all(torch.equal(_eval_weights(reopened)[k], drawn[decision["kept"]][k]) for k in start)


def test_enough_stops_drawing(tiny_model_dir, tmp_path):
    """draw_enough 0: any recall of harmful compliances ends the phase after
    draw 1; a slice with none to recall gives no score, which is never enough."""
    from lora_triplay.core.session import Session

    session = Session.open(build_recipe(_recipe(tiny_model_dir, draws=3, draw_enough=0.0)), tmp_path / "r")
    session.run()
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    checks = [r for r in rows if r["phase"] == "eval_heldout" and "draw" in r]
    (decision,) = [r for r in rows if r["phase"] == "eval_draws"]
    drawn = 1 if checks[0].get("recall_harmful_negative") is not None else 3
    assert [c["draw"] for c in checks] == list(range(1, drawn + 1)) and decision["drawn"] == drawn
    assert max(r["step"] for r in rows if r["phase"] == "eval_warmup") == 2 * drawn


@pytest.mark.slow
def test_a_crash_between_draws_resumes_exactly(tiny_model_dir, tmp_path):
    """Killed at the commit that would end draw 2: its weights are on disk,
    eval is back at its start, and the state still says draw 2 is under
    way. Resumed: the same kept draw, the same weights and rows as a run
    never stopped."""
    import yaml

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(_recipe(tiny_model_dir, draws=3)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("LORA_TRIPLAY_CRASH_AT", None)

    def cli(run: Path, *extra: str, crash: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "lora_triplay.cli", "run", str(recipe), "--run-dir", str(run), *extra],
                              env={**env, **({"LORA_TRIPLAY_CRASH_AT": crash} if crash else {})},
                              capture_output=True, text=True, timeout=600)

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert cli(whole).returncode == 0
    killed = cli(cut, crash="commit:5")  # commits: the run's first, then one per step: the 5th ends draw 2
    assert killed.returncode == -9, killed.stderr[-2000:]
    at_kill = json.loads((cut / "state.json").read_text())
    assert (at_kill["step"], len(at_kill["eval_draws"])) == (3, 1), "killed in draw 2's last step"
    assert (cut / "eval_draws" / "draw-2.safetensors").exists()  # written before the commit that would count it
    assert cli(cut, "--resume").returncode == 0

    def final(run: Path) -> tuple:
        rows = [{k: v for k, v in json.loads(x).items() if "seconds" not in k} for x in (run / "metrics.jsonl").read_text().splitlines()]
        state = json.loads((run / "state.json").read_text())
        weights = {f"{p.name}:{k}": v for p in sorted((run / "eval_draws").glob("*.safetensors")) for k, v in load_file(str(p)).items()}
        return rows, state["eval_draws"], weights

    (rows_a, draws_a, w_a), (rows_b, draws_b, w_b) = final(whole), final(cut)
    assert draws_a == draws_b and rows_a == rows_b
    assert w_a.keys() == w_b.keys() and all(torch.equal(w_a[k], w_b[k]) for k in w_a)


def test_draws_refuse_several_processes(tiny_model_dir, tmp_path):
    """Saving and restoring draws across ranks is not built: a run with more
    than one process says so before any step, not after training ranks apart."""
    from types import SimpleNamespace

    from lora_triplay.errors import UserError
    from lora_triplay.triplay.eval_draws import EvalDraws

    game = TriPlay(build_recipe(_recipe(tiny_model_dir, draws=3)))
    game.session = SimpleNamespace(collective=SimpleNamespace(world=2))
    with pytest.raises(UserError, match="one process"):
        EvalDraws(game)
    game.session.collective.world = 1
    assert EvalDraws(game).active
