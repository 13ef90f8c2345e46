"""Exact resume: SIGKILL a tiny-model run at five different moments, resume
each time, and require the end state to equal an uninterrupted run's bit for
bit: adapters, optimizer states, attack success pool, eval's pairs and the
panel's labels, metrics (timings aside)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from inprocess import run_cli
from safetensors.torch import load_file

RECIPE = """\
model: {{base: "{base}", device: cpu, dtype: float32}}
lora: {{rank: 4, alpha: 8}}
iterations: 2
run: {{checkpoint_every: {every}}}
phases: {{red: {{steps: {red_steps}}}, blue: {{steps: 2}}, eval: {{steps: 2}}, eval_warmup: {{steps: {warmup}, pairs: 6, average_last: 2}}}}
data: {{benign_share: {benign}}}
grpo: {{group_size: 4, prompts_per_step: 2, lr: 1.0e-3, max_new_tokens: 8}}
rewards: {{judge_mode: choice, embedding_model: hashing}}
defenders: [{{name: blue, weight: 1.0}}, {{name: base, weight: 0.5}}, {{name: blue@1, weight: 0.5}}, {{name: blue@-1, weight: 0.3}}]
experts: {{safety_experts: 2, utility_experts: 2}}
control: {control}
league: {league}
"""
LEAGUE = "{size: 2, weight: 0.4, attacker_share: 1.0}"
CONTROL = "{adaptive: true, red_asr_high: 0.0, extra_steps: 1, drift_check: true, drift_pairs: 4, drift_drop: 0.0}"
# Each entry: the moment the process kills itself (n-th time it gets there).
CRASHES = ["generate:3", "optimizer:2", "checkpoint:2", "snapshot:3", "commit:4"]
pytestmark = pytest.mark.slow


def _cli(recipe: Path, run_dir: Path, *extra: str, crash: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("LORA_TRIPLAY_CRASH_AT", None)
    if crash:
        env["LORA_TRIPLAY_CRASH_AT"] = crash
    cmd = [sys.executable, "-m", "lora_triplay.cli", "run", str(recipe), "--run-dir", str(run_dir), *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def _run(recipe: Path, run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    """The same command in this process, for the runs no kill interrupts
    (bit-identical to the subprocess's: the tests below compare them)."""
    return run_cli("run", recipe, "--run-dir", run_dir, *extra)


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for file in sorted(folder.rglob("*.safetensors")):
        for key, value in load_file(str(file)).items():
            out[f"{file.relative_to(folder)}::{key}"] = value
    return out


def _final_state(run: Path) -> dict:
    state = json.loads((run / "state.json").read_text())
    metrics = [{k: v for k, v in json.loads(line).items() if "seconds" not in k}
               for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {
        "state": {k: v for k, v in state.items() if k != "rng"},
        "metrics": metrics,
        **{name: (run / f"{name}.jsonl").read_text() for name in ("asp", "eval_pairs", "panel")},
    }


def _interrupt(recipe: Path, run_dir: Path) -> None:
    """Ctrl-C (SIGINT) once the run has committed a step: exit 130 and one
    line with the command that continues the folder."""
    import shlex
    import time

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("LORA_TRIPLAY_CRASH_AT", None)
    # SIGINT as a terminal gives it: a shell's background job (CI under nohup, `make test &`) starts its children with
    # SIGINT ignored, and Python then never raises KeyboardInterrupt
    proc = subprocess.Popen([sys.executable, "-m", "lora_triplay.cli", "run", str(recipe), "--run-dir", str(run_dir)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        state = run_dir / "state.json"
        if state.is_file() and json.loads(state.read_text())["global_step"] >= 1:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    hint = err.strip().splitlines()[-1]
    assert hint.startswith("interrupted; the run folder keeps its last committed step. Continue with: lora-triplay run ")
    assert shlex.split(hint.split("Continue with: ")[1])[2:] == [str(recipe), "--resume", "--run-dir", str(run_dir)]


@pytest.fixture(scope="module", params=[1, 3], ids=["commit-every-step", "commit-every-3"])
def runs(request, tmp_path_factory, tiny_model_dir):
    """Commit every step, and every 3 steps (red runs 4 steps then: one
    commit mid-phase, one at its end; kills between commits lose steps
    that the resume must redo exactly). The second also has eval's warm
    start (ending on the mean of its two steps' weights), blue's benign stream and control.py's adaptive phases and drift
    checks, and a league of past adapters, whose cursors, pools and decisions
    must resume too."""
    every = request.param
    root = tmp_path_factory.mktemp(f"resume-{every}")
    recipe = root / "recipe.yaml"
    recipe.write_text(RECIPE.format(base=tiny_model_dir, every=every, red_steps=2 if every == 1 else 4,
                                    warmup=0 if every == 1 else 2, benign=0.0 if every == 1 else 0.5,
                                    control="{}" if every == 1 else CONTROL, league="{}" if every == 1 else LEAGUE))
    reference = _run(recipe, root / "reference")
    assert reference.returncode == 0, reference.stderr[-2000:]
    killed = root / "killed"
    if every == 1:  # the run starts with a Ctrl-C: the hint names the command that continues it
        _interrupt(recipe, killed)
    lost_steps = 0  # metrics rows written after the last commit, which the resume must redo
    for i, crash in enumerate(CRASHES):
        proc = _cli(recipe, killed, *(["--resume"] if i or every == 1 else []), crash=crash)
        assert proc.returncode == -signal.SIGKILL, f"{crash}: expected a SIGKILL, got {proc.returncode}\n{proc.stderr[-2000:]}"
        committed = json.loads((killed / "state.json").read_text())["counts"]["metrics"]
        lost_steps += len((killed / "metrics.jsonl").read_text().splitlines()) - committed
        if i == 1:  # a kill inside an append leaves half a row after the committed ones
            for name in ("asp", "transcripts"):
                with open(killed / f"{name}.jsonl", "a", encoding="utf-8") as f:
                    f.write('{"text": "a row the kill cut sh')
    if every > 1:
        assert lost_steps > 0, "no kill fell between two commits: the cadence was not exercised"
    final = _run(recipe, killed, "--resume")
    assert final.returncode == 0, final.stderr[-2000:]
    return root / "reference", killed


def test_resumed_run_equals_uninterrupted_run(runs):
    reference, killed = runs
    ref, got = _final_state(reference), _final_state(killed)
    assert got["state"] == ref["state"]
    assert got["metrics"] == ref["metrics"]
    for name in ("asp", "eval_pairs", "panel"):
        assert got[name] == ref[name], f"{name}.jsonl differs"


def test_adapters_and_optimizers_are_bit_identical(runs):
    reference, killed = runs
    for sub in ("checkpoints", "red", "blue", "eval"):
        ref, got = _tensors(reference / sub), _tensors(killed / sub)
        assert ref.keys() == got.keys(), sub
        for key in ref:
            assert torch.equal(ref[key], got[key]), key


def test_no_half_written_folders_survive(runs):
    _, killed = runs
    leftovers = [p for p in killed.rglob(".*") if p.name not in (".", "..")]
    assert not leftovers, leftovers


def test_resume_with_another_recipe_is_refused(runs, tmp_path):
    reference, _ = runs
    changed = tmp_path / "changed.yaml"
    changed.write_text((reference / "recipe.yaml").read_text().replace("lr: 0.001", "lr: 0.002"))
    proc = _run(changed, reference, "--resume")
    assert proc.returncode == 2
    assert "grpo.lr: 0.001 -> 0.002" in proc.stderr and "--allow-recipe-change" in proc.stderr
    assert "Traceback" not in proc.stderr
    # the command it suggests (the run's own recipe.yaml, its overrides in it) resumes: here a finished run, at once
    import shlex

    from typer.testing import CliRunner

    from lora_triplay.cli import app

    suggested = shlex.split(proc.stderr.split("the run keeps them: `")[1].split("`")[0])
    assert suggested == ["lora-triplay", "run", str(reference / "recipe.yaml"), "--resume", "--run-dir", str(reference)]
    before = (reference / "state.json").read_text()
    assert CliRunner().invoke(app, suggested[1:]).exit_code == 0
    assert (reference / "state.json").read_text() == before


def test_a_new_run_never_overwrites_an_existing_one(runs, tmp_path):
    reference, _ = runs
    before = (reference / "state.json").read_text()
    proc = _run(reference / "recipe.yaml", reference)
    assert proc.returncode == 2 and "--resume" in proc.stderr
    assert (reference / "state.json").read_text() == before


def test_a_resume_with_a_new_learning_rate_trains_at_that_rate(tiny_model_dir, tmp_path):
    """`--resume --allow-recipe-change grpo.lr=...` (what our own error
    suggests) must train at the new rate: the optimizer's moments come from
    the checkpoint, its hyper-parameters from the recipe. AdamW's step is
    about lr x sign(gradient), so red's second step moves its adapter ~50x
    further at 50x the rate."""
    import shutil

    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.format(base=tiny_model_dir, every=1, red_steps=2, warmup=0, benign=0.0, control="{}", league="{}")
                      .replace("iterations: 2", "iterations: 1"))
    killed = tmp_path / "killed"
    assert _cli(recipe, killed, crash="commit:3").returncode != 0  # after red's first step, before its second commits
    state = json.loads((killed / "state.json").read_text())
    assert (state["phase"], state["step"]) == ("red", 1)
    after_one = load_file(str(killed / state["checkpoints"]["red"] / "adapter_model.safetensors"))
    same, faster, damaged = tmp_path / "same", tmp_path / "faster", tmp_path / "damaged"
    shutil.copytree(killed, same)
    shutil.copytree(killed, faster)
    shutil.copytree(killed, damaged)
    (damaged / state["checkpoints"]["red"] / "optimizer.safetensors").unlink()  # resumed, red's AdamW would restart from nothing
    from lora_triplay.core.session import Session  # in this process: the refusals need no CLI start of their own
    from lora_triplay.errors import UserError
    from lora_triplay.recipe import load_recipe

    with pytest.raises(UserError, match="has no optimizer state"):
        Session.open(load_recipe(recipe), damaged, resume=True)
    assert _run(recipe, same, "--resume").returncode == 0
    proc = _run(recipe, faster, "--resume", "--allow-recipe-change", "grpo.lr=5.0e-2")
    assert proc.returncode == 0, proc.stderr[-2000:]

    def moved(run: Path) -> float:
        red = load_file(str(run / "red" / "iter-0001" / "adapter_model.safetensors"))
        return sum((red[k] - v).abs().sum().item() for k, v in after_one.items())

    assert moved(faster) > 20 * moved(same) > 0
    # a change the run cannot load under fails and leaves the folder's recipe as it was
    with pytest.raises(UserError, match="lora.rank = 8"):
        Session.open(load_recipe(recipe, ["lora.rank=8"]), damaged, resume=True, allow_recipe_change=True)
    assert (damaged / "recipe.yaml").read_text() == (killed / "recipe.yaml").read_text()
    assert not list(damaged.glob("recipe.prev-*"))
    # the run now goes on under the new recipe: recipe.yaml says so, the old one stays beside it
    assert "lr: 0.05" in (faster / "recipe.yaml").read_text()
    assert [p.name for p in faster.glob("recipe.prev-*.yaml")] == ["recipe.prev-000001.yaml"]
    assert "lr: 0.001" in (faster / "recipe.prev-000001.yaml").read_text()
    # a finished run given more iterations goes on from the next iteration
    assert json.loads((faster / "state.json").read_text())["done"]
    proc = _run(recipe, faster, "--resume", "--allow-recipe-change", "grpo.lr=5.0e-2", "iterations=2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    state = json.loads((faster / "state.json").read_text())
    assert state["done"] and state["iteration"] == 2 and (faster / "red" / "iter-0002").is_dir()
    assert "iterations: 2" in (faster / "recipe.yaml").read_text()
    # a finished run the change does not extend trains nothing under it: its recipe stays the one it ran under
    before, state = (faster / "recipe.yaml").read_text(), (faster / "state.json").read_text()
    Session.open(load_recipe(recipe, ["grpo.lr=0.5", "iterations=2"]), faster, resume=True, allow_recipe_change=True).run()
    assert (faster / "recipe.yaml").read_text() == before and (faster / "state.json").read_text() == state
