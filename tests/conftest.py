"""Shared fixtures: the tiny random Qwen3 (built from a config, no download)
and a PeftModel with the three role adapters on it."""
from __future__ import annotations

import os

import pytest

# One thread: on a 2-core machine torch's default of 2 threads was 5-10x
# slower whenever another process was busy (measured; see bench/).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _pin_xdist_worker() -> None:
    """Under `pytest -n N` (make test), worker k runs on core k mod cores,
    and so do the processes it starts. Why: a vLLM engine binds an OpenMP
    thread to every core it is allowed (engine/vllm_setup.py), and OpenMP
    threads that share a core with a busy process ran many times slower
    (bench/BENCHMARKS.md); pinned, each worker is a one-core machine."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) > 1:
        os.sched_setaffinity(0, {cores[int(worker[2:]) % len(cores)]})


_pin_xdist_worker()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from lora_triplay.tiny import build_tiny_qwen3

    return str(build_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3")))


@pytest.fixture()
def role_model(tiny_model_dir):
    """(peft_model, tokenizer) with red/blue/evaluator adapters whose B
    matrices are random, so every adapter computes something different."""

    from lora_triplay.model import attach_role_adapters, load_base
    from lora_triplay.recipe import LoraConfig, ModelConfig
    from lora_triplay.tiny import randomize_lora_b
    from lora_triplay.triplay.roles import ROLE_ADAPTERS

    base, tok, _ = load_base(ModelConfig(base=tiny_model_dir, device="cpu", dtype="float32"))
    model = attach_role_adapters(base, LoraConfig(rank=4, alpha=8), seed=0, names=list(ROLE_ADAPTERS.values()))
    randomize_lora_b(model, seed=1, scale=0.5)
    model.eval()
    return model, tok


@pytest.fixture()
def endpoint(monkeypatch):
    """chat_endpoint.CANNED (a judge that always answers `Label: negative`)
    served on loopback, its record cleared, with a key in the judges'
    environment variable: the URL."""
    from chat_endpoint import CANNED

    monkeypatch.setenv("LORA_TRIPLAY_JUDGE_API_KEY", "sk-test-SECRET-8c1f")
    CANNED.seen, CANNED.status = [], 200
    with CANNED.serving() as url:
        yield url


FINISHED_RUN = """\
model: {{base: "{base}", device: cpu, dtype: float32}}
lora: {{rank: 4, alpha: 8}}
iterations: 1
phases: {{red: {{steps: 2}}, blue: {{steps: 2}}, eval: {{steps: 2}}}}
grpo: {{group_size: 4, prompts_per_step: 2, lr: 1.0e-3, max_new_tokens: 8}}
rewards: {{judge_mode: choice, embedding_model: hashing}}
defenders: [{{name: blue, weight: 1.0}}, {{name: base, weight: 0.5}}]
experts: {{safety_experts: 2, utility_experts: 2}}
"""


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory, tiny_model_dir):
    """A finished 1-iteration run on the tiny model (2 GRPO steps per
    phase): iter-0000 (the untrained adapters) and iter-0001 of every role;
    the inference commands' tests (export, play, chat, serve) read it."""
    from typer.testing import CliRunner

    from lora_triplay.cli import app

    root = tmp_path_factory.mktemp("infer")
    (root / "tiny.yaml").write_text(FINISHED_RUN.format(base=tiny_model_dir))
    result = CliRunner().invoke(app, ["run", str(root / "tiny.yaml"), "--run-dir", str(root / "run")])
    assert result.exit_code == 0, result.output
    return root / "run"
