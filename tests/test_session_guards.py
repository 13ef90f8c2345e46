"""Numerical guards at run level: a NaN loss skips the step and is logged;
N in a row stop the run with a clear message; nothing non-finite reaches
the disk."""
from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from lora_triplay.core.session import RunError, Session
from lora_triplay.recipe import build_recipe
from lora_triplay.triplay import loop


def _recipe(base):
    return build_recipe({
        "model": {"base": base, "device": "cpu", "dtype": "float32"},
        "lora": {"rank": 4, "alpha": 8},
        "phases": {"red": {"steps": 3}, "blue": {"steps": 1}, "eval": {"steps": 1}},
        "grpo": {"group_size": 2, "prompts_per_step": 1, "max_new_tokens": 6, "max_nonfinite_steps": 2},
        "rewards": {"judge_mode": "choice", "embedding_model": "hashing"},
        "experts": {"safety_experts": 1, "utility_experts": 1},
    })


def test_nan_steps_are_skipped_then_stop_the_run(tmp_path, tiny_model_dir, monkeypatch):
    def nan_advantages(samples, cfg):
        for x in samples:
            x.advantage = math.nan
        return {}

    monkeypatch.setattr(loop, "assign_advantages", nan_advantages)
    session = Session.open(_recipe(tiny_model_dir), tmp_path / "run")
    with pytest.raises(RunError, match="2 GRPO steps in a row had a NaN/inf loss"):
        session.run()
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    assert state["step"] == 1 and state["nonfinite"]["red"] == 1  # the first skip was committed
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["skipped"] is True and not math.isfinite(rows[0]["loss"])
    saved = load_file(str(tmp_path / "run" / state["checkpoints"]["red"] / "adapter_model.safetensors"))
    start = load_file(str(tmp_path / "run" / "red" / "iter-0000" / "adapter_model.safetensors"))
    assert all(torch.isfinite(t).all() and torch.equal(t, start[k]) for k, t in saved.items())


def test_non_finite_weights_are_never_written(tmp_path, tiny_model_dir):
    session = Session.open(_recipe(tiny_model_dir), tmp_path / "run")
    with torch.no_grad():
        next(p for n, p in session.model.named_parameters() if ".red." in n).fill_(math.inf)
    before = (tmp_path / "run" / "state.json").read_text()
    with pytest.raises(RunError, match="NaN/inf weights"):
        session._checkpoint("red")
    assert (tmp_path / "run" / "state.json").read_text() == before
