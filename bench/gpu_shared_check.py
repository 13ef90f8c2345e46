"""engine.share_base on a CUDA GPU with vLLM: prepared, not yet run (the
project's lent GPU machine has no vLLM, and vLLM's CUDA wheel is far over
what can be carried there). Run it wherever vLLM and a GPU are:

    python bench/gpu_shared_check.py [--layers 28] [--out bench/results/gpu_shared_check.json]

A Qwen3-shaped base with random weights (Qwen3-1.7B's shape by default,
built from a config, nothing downloaded) is served by vLLM with sleep mode,
each layout in a fresh process:
  unshared  the trainer's HF base + adapters beside vLLM's own copy; the
            update runs with vLLM asleep (level 1)
  shared    engine.share_base: the trainer on vLLM's weights; the start-up
            check; the update runs with only vLLM's KV cache released
For each: GPU memory allocated by torch in this process and used on the
device (nvidia-smi) after rollouts and during the update, sleep and wake
seconds, and one GRPO step. Expected: shared saves about one base copy
(2 bytes x parameters) and its sleep/wake moves no weights.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build_base(folder: Path, layers: int, small: bool = False) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from lora_triplay.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    hidden, heads = (128, 4) if small else (2048, 16)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=heads // 2, head_dim=hidden // heads, tie_word_embeddings=True,
                      max_position_embeddings=4096, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32 if small else torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return folder


def used_mb() -> float:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"], capture_output=True, text=True)
    return float(out.stdout.split()[0]) if out.returncode == 0 else float("nan")


def layout(kind: str, folder: str, device: str) -> dict:
    import torch

    from lora_triplay.engine import shared_base
    from lora_triplay.engine.base import Request, Sampling
    from lora_triplay.engine.vllm import VLLMEngine
    from lora_triplay.model import activate, attach_role_adapters, load_base, load_tokenizer
    from lora_triplay.recipe import GrpoConfig, LoraConfig, ModelConfig
    from lora_triplay.training.grpo import GrpoLearner, Sample

    dtype = "bfloat16" if device == "cuda" else "float32"
    cfg = ModelConfig(base=folder, device=device, dtype=dtype)
    gpu = device == "cuda"
    tok = load_tokenizer(folder, cfg)
    lora, names = LoraConfig(rank=16, alpha=32), ["red", "blue", "evaluator"]
    opts = dict(lora_rank=16, seed=0, max_loras=4, max_model_len=2048, gpu_memory_utilization=0.4,
                enable_sleep_mode=True, dtype=dtype)
    res: dict = {"layout": kind}
    t0 = time.perf_counter()
    if kind == "shared":
        engine = VLLMEngine(folder, tok, share_base=True, **opts)
        base = shared_base.trainer_on_engine(engine.model_module(), folder, cfg, getattr(torch, dtype), "sdpa")
        model = attach_role_adapters(base, lora, 0, names)
        engine.attach_trainer(model)
        res["not_shared_bytes"] = shared_base.shares_every_weight(model, engine.model_module())
        res["start_up_check"] = shared_base.check_same_forward(engine, model, tok) or "ok"
    else:
        model, _, _ = load_base(cfg)
        model = attach_role_adapters(model, lora, 0, names)
        engine = VLLMEngine(folder, tok, trainer=model, **opts)
    res["start_s"] = round(time.perf_counter() - t0, 1)
    for n in names:
        engine.sync_adapter(n)
    msgs = [{"role": "user", "content": "Describe the weather in three sentences."}]
    out = engine.generate([Request(a, msgs) for a in ("base", *names) for _ in range(8)], Sampling(max_new_tokens=64, temperature=1.0, seed=0))
    res["rollouts"] = {"torch_allocated_mb": round(torch.cuda.memory_allocated() / 2**20), "device_used_mb": used_mb()} if gpu else {}
    t0 = time.perf_counter()
    engine.sleep()
    res["sleep_s"] = round(time.perf_counter() - t0, 2)
    learner = GrpoLearner(model, activate(model, "blue"), GrpoConfig(beta=0.04), lr=1e-5, pad_id=tok.pad_token_id)
    c = out[16][0]
    learner.step([Sample(c.prompt_ids, c.token_ids, 0, 1.0, advantage=1.0), Sample(c.prompt_ids, c.token_ids[:8], 0, 0.0, advantage=-1.0)])
    res["update"] = {"torch_allocated_mb": round(torch.cuda.memory_allocated() / 2**20), "device_used_mb": used_mb(),
                     "torch_peak_mb": round(torch.cuda.max_memory_allocated() / 2**20)} if gpu else {}
    t0 = time.perf_counter()
    engine.wake_up()
    res["wake_s"] = round(time.perf_counter() - t0, 2)
    engine.sync_adapter("blue")
    again = engine.generate([Request("blue", msgs)], Sampling(max_new_tokens=16, temperature=0.0))[0][0]
    res["after_wake_tokens"] = len(again.token_ids)
    engine.close()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a tiny shape, to check the script runs")
    ap.add_argument("--layout", choices=("shared", "unshared"), help=argparse.SUPPRESS)
    ap.add_argument("--base", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_shared_check.json"))
    args = ap.parse_args()
    if args.layout:
        print(json.dumps(layout(args.layout, args.base, args.device)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = str(build_base(Path(tmp) / "qwen3-random", args.layers, small=args.device == "cpu"))
        res = {"layers": args.layers}
        for kind in ("unshared", "shared"):
            cmd = [sys.executable, __file__, "--layout", kind, "--base", folder, "--device", args.device]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if proc.returncode:
                res[kind] = {"error": proc.stderr[-2000:]}
                continue
            res[kind] = json.loads(proc.stdout.strip().splitlines()[-1])
    if all(res.get(k, {}).get("rollouts") for k in ("shared", "unshared")):
        res["saved_mb_rollouts"] = res["unshared"]["rollouts"]["device_used_mb"] - res["shared"]["rollouts"]["device_used_mb"]
    print(json.dumps(res, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
