"""End to end on the tiny random Qwen3, through the CLI: one iteration,
two GRPO steps per phase. Phase by phase, the active adapter must change
and nothing else may: not the other two adapters, not one base tensor."""
from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from lora_triplay.cli import app
from lora_triplay.core import session as session_mod
from lora_triplay.triplay.roles import ROLE_ADAPTERS

RECIPE = """\
model: {{base: "{base}", device: cpu, dtype: float32}}
lora: {{rank: 4, alpha: 8}}
iterations: 1
phases: {{red: {{steps: 2}}, blue: {{steps: 2}}, eval: {{steps: 2}}}}
grpo: {{group_size: 4, prompts_per_step: 2, lr: 1.0e-3, max_new_tokens: 10}}
rewards: {{judge_mode: choice, embedding_model: hashing}}
defenders: [{{name: blue, weight: 1.0}}, {{name: base, weight: 0.5}}]
experts: {{safety_experts: 2, utility_experts: 2}}
"""

STEP_FIELDS = {"iteration", "phase", "step", "reward_mean", "reward_std", "loss", "kl", "entropy", "step_seconds",
               "rollout_seconds", "update_seconds", "sync_seconds", "checkpoint_seconds"}
PHASE_FIELDS = {
    # iteration 1: blue is untrained, i.e. the base, so `base` is skipped as a duplicate defender
    "red": {"asr_blue", "semantic_pass_rate", "diversity_penalty", "s_bleu", "s_cos", "judge_rate_negative", "defenders",
            "seconds_defenders", "seconds_diversity"},
    "blue": {"rate_negative", "rate_rejective", "rate_positive"},
    "eval": {"accuracy", "labelled_pairs", "panel_agreement"},
}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_model_dir):
    """Run the CLI once; record every tensor at the start and after each phase."""
    root = tmp_path_factory.mktemp("e2e")
    recipe = root / "tiny.yaml"
    recipe.write_text(RECIPE.format(base=tiny_model_dir))
    states: dict[str, dict[str, torch.Tensor]] = {}
    orig_open, orig_advance = session_mod.Session.open.__func__, session_mod.Session._advance_phase

    def snap(session):
        return {n: p.detach().clone() for n, p in session.model.named_parameters()}

    def open_and_record(cls, *a, **kw):
        s = orig_open(cls, *a, **kw)
        states["start"] = snap(s)
        return s

    def advance_and_record(self):
        states[self.state["phase"]] = snap(self)
        orig_advance(self)

    mp = pytest.MonkeyPatch()
    mp.setattr(session_mod.Session, "open", classmethod(open_and_record))
    mp.setattr(session_mod.Session, "_advance_phase", advance_and_record)
    try:
        result = CliRunner().invoke(app, ["run", str(recipe), "--run-dir", str(root / "run")])
    finally:
        mp.undo()
    assert result.exit_code == 0, result.output
    return root / "run", states, result.output


@pytest.mark.parametrize("phase,previous", [("red", "start"), ("blue", "red"), ("eval", "blue")])
def test_only_the_active_adapter_changes(tiny_run, phase, previous):
    _, states, _ = tiny_run
    before, after = states[previous], states[phase]
    active = f".{ROLE_ADAPTERS[phase]}."
    changed = [n for n in after if not torch.equal(after[n], before[n])]
    assert changed, f"nothing changed in phase {phase}"
    assert all(active in n for n in changed), f"phase {phase} changed other tensors: {[n for n in changed if active not in n][:3]}"
    lora_b = [n for n in after if active in n and "lora_B" in n]
    assert lora_b and all(n in changed for n in lora_b), f"some of {phase}'s lora_B tensors did not move"


def test_run_folder_is_complete(tiny_run):
    run, _, output = tiny_run
    for role in ("red", "blue", "eval"):
        for it in (0, 1):
            folder = run / role / f"iter-{it:04d}"
            assert (folder / "adapter_model.safetensors").is_file() and (folder / "adapter_config.json").is_file()
    state = json.loads((run / "state.json").read_text())
    for role in ("red", "blue", "eval"):
        # exactly one committed checkpoint per role: adapter + optimizer state
        ckpts = list((run / "checkpoints" / role).iterdir())
        assert [run / state["checkpoints"][role]] == ckpts
        for name in ("adapter_model.safetensors", "adapter_config.json", "optimizer.safetensors", "optimizer.json"):
            assert (ckpts[0] / name).is_file(), name
    for name in ("recipe.yaml", "state.json", "metrics.jsonl", "eval_pairs.jsonl", "panel.jsonl", "transcripts.jsonl"):
        assert (run / name).is_file(), name
    assert state["done"] and state["counts"]["metrics"] == 6
    pairs = [json.loads(line) for line in (run / "eval_pairs.jsonl").read_text().splitlines()]
    assert {p["defender"] for p in pairs} == {"blue"} and {p["phase"] for p in pairs} == {"red", "blue"}
    assert str(run.resolve()) in output.replace("\n", "")


def test_metrics_rows_for_every_phase(tiny_run):
    run, _, _ = tiny_run
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["phase"], r["step"]) for r in rows] == [(p, s) for p in ("red", "blue", "eval") for s in (1, 2)]
    for row in rows:
        missing = (STEP_FIELDS | PHASE_FIELDS[row["phase"]]) - set(row)
        assert not missing, f"{row['phase']} row lacks {missing}"
        if row["phase"] == "red":
            assert row["defenders"] == 1.0 and "asr_base" not in row


def test_snapshots_load_with_plain_peft(tiny_run, tiny_model_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run, states, _ = tiny_run
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model = PeftModel.from_pretrained(base, run / "blue" / "iter-0001")
    loaded = {n.replace(".default.", ".blue."): p for n, p in model.named_parameters() if "lora_" in n}
    trained = {n: t for n, t in states["blue"].items() if ".blue." in n}
    assert loaded.keys() == trained.keys()
    assert all(torch.equal(loaded[n], trained[n]) for n in trained)


def test_metrics_reach_tensorboard_and_wandb(tmp_path, tiny_model_dir, monkeypatch):
    """run.report_to: every step's numbers also land in TensorBoard event
    files and in an (offline) Weights & Biases run."""
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from lora_triplay.core.trackers import Trackers

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    # a row reaches the trackers only once committed: one lost to a crash is redone on resume and logged once
    logged, real_log = [], Trackers.log

    def log_after_commit(self, row):
        committed = json.loads((tmp_path / "run" / "state.json").read_text())["global_step"]
        logged.append((row["global_step"], committed))
        real_log(self, row)

    monkeypatch.setattr(Trackers, "log", log_after_commit)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.format(base=tiny_model_dir).replace("steps: 2", "steps: 1").replace("red: {steps: 1}", "red: {steps: 3}")
                      + "run: {report_to: [jsonl, tensorboard, wandb], checkpoint_every: 2}\n")
    result = CliRunner().invoke(app, ["run", str(recipe), "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert logged and all(step <= committed for step, committed in logged), logged
    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert {"red/reward_mean", "blue/loss", "eval/accuracy"} <= set(tags)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    red = [r for r in rows if r["phase"] == "red"]
    events = acc.Scalars("red/reward_mean")
    assert [e.step for e in events] == [r["global_step"] for r in red] and len(red) == 3
    assert [e.value for e in events] == pytest.approx([r["reward_mean"] for r in red], abs=1e-6)
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*"))


def test_a_missing_tracker_package_is_one_line(tmp_path, tiny_model_dir, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.format(base=tiny_model_dir) + "run: {report_to: [wandb]}\n")
    result = CliRunner().invoke(app, ["run", str(recipe), "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 2 and "pip install wandb" in result.output
    assert not (tmp_path / "run").exists()


def test_readme_run_folder_table_matches_the_run(tiny_run):
    """Every path the README's run-folder table names exists in a real run."""
    import re
    from pathlib import Path

    run, _, _ = tiny_run
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme.split("Every run writes one folder", 1)[1].split("\n\n", 2)[1]
    paths = [p for line in table.splitlines() if line.startswith("| `") for p in re.findall(r"`([^`]+)`", line.split("|")[1])]
    assert len(paths) >= 8, paths
    for path in paths:
        pattern = re.sub(r"<[^>]+>", "*", path).replace("NNNNNN", "*").replace("NNNN", "*").rstrip("/")
        assert list(run.glob(pattern)), f"README names {path!r} but the run has no {pattern!r}"
    # the files the table describes inside a checkpoint
    ckpt = next(run.glob("checkpoints/*/step-*"))
    for name in ("adapter_model.safetensors", "adapter_config.json", "optimizer.safetensors", "optimizer.json"):
        assert (ckpt / name).is_file(), name


# Measured once on this repo's tiny run (the same on 1 and 2 torch threads;
# re-measured 2026-12-03: the tiny tokenizer is trained on the package's
# prompt files, and half the builtin harmful requests became questions so
# that a request's form no longer tells its kind; re-measured 2026-12-06:
# the HF engine samples by inverse CDF, engine/decode.py, the same
# distribution from another stream of random numbers):
# (phase, step, reward_mean, grad_norm, entropy, kl). A change to sampling,
# rewards, advantages, the loss or the optimizer moves these numbers; if the
# change is intended, rerun the tiny recipe and update them in the same commit.
PINNED = [
    ("red", 1, 0.001723, 0.034078, 6.917116, 0.0),
    ("red", 2, 0.001746, 0.027231, 6.917088, 3.564e-06),
    ("blue", 1, 0.530079, 0.150463, 6.917311, 0.0),
    ("blue", 2, 0.537192, 0.183134, 6.917326, 7.299e-06),
    ("eval", 1, 0.333333, 0.214583, 6.916709, 0.0),
    ("eval", 2, 0.333333, 0.114547, 6.916713, 0.0001182),
]


def test_same_seed_gives_the_pinned_rewards_and_gradients(tiny_run):
    run, _, _ = tiny_run
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    got = [(r["phase"], r["step"], r["reward_mean"], r["grad_norm"], r["entropy"], r["kl"]) for r in rows]
    assert [g[:2] for g in got] == [p[:2] for p in PINNED]
    for g, p in zip(got, PINNED):
        assert g[2] == pytest.approx(p[2], abs=1e-5), (g, p)
        assert g[3] == pytest.approx(p[3], rel=1e-3), (g, p)
        assert g[4] == pytest.approx(p[4], abs=1e-4), (g, p)
        assert g[5] == pytest.approx(p[5], rel=1e-2, abs=1e-8), (g, p)
