"""The GPU-only part of model.fsdp, on one GPU (run by bench/gpu_check.sh):
where the CPU tests cannot look, does a sharded base land on the GPU and
compute what the unsharded one does?

One process, a 1-rank NCCL group (one GPU cannot hold two NCCL ranks), the
tiny Qwen3 in bf16: the same model built twice, once sharded with
sharding.shard_base over a 1-rank CUDA mesh. Checked: every parameter and
buffer of the sharded model is on the GPU (shard_base moves what FSDP does
not manage), greedy generation through the engine with the lockstep on
gives the same tokens, and one GRPO gradient and the forced-choice scores
agree. Multi-rank behaviour (the lockstep with unequal work, the gathers)
is tested on CPU processes in tests/test_distributed.py.

    torchrun --standalone --nproc_per_node 1 bench/gpu_fsdp_check.py [--out FILE]
    torchrun --standalone --nproc_per_node 1 bench/gpu_fsdp_check.py --dry-run   # gloo on the CPU: the script itself
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build(folder: str, device, dtype, mesh=None):
    import torch

    from lora_triplay.model import attach_role_adapters, load_base
    from lora_triplay.recipe import LoraConfig, ModelConfig
    from lora_triplay.tiny import randomize_lora_b
    from lora_triplay.training.sharding import shard_base
    from lora_triplay.triplay.roles import ROLE_ADAPTERS

    cfg = ModelConfig(base=folder, device=device.type, dtype=str(dtype).removeprefix("torch."))
    base, tok, _ = load_base(cfg, place=False)  # both built on the CPU: the same draws, whatever the device
    model = attach_role_adapters(base, LoraConfig(rank=8, alpha=16), 0, list(ROLE_ADAPTERS.values()))
    randomize_lora_b(model, seed=1, scale=0.05)
    if mesh is not None:
        shard_base(model, mesh, device)
    else:
        model.to(device)
    torch.manual_seed(0)
    return model.eval(), tok


def run_checks(model, tok, device) -> dict:
    from lora_triplay.engine.base import Request, Sampling
    from lora_triplay.engine.hf import HFEngine
    from lora_triplay.model import activate
    from lora_triplay.recipe import GrpoConfig, LoraConfig
    from lora_triplay.training.grpo import GrpoLearner, Sample
    from lora_triplay.training.sharding import is_sharded

    engine = HFEngine(model, tok, max_batch_size=4, lora=LoraConfig(rank=8, alpha=16))
    asks = ["hello there", "tell me a story", "what is rain", "name a colour", "say something", "why"]
    reqs = [Request(["red", "blue", "evaluator", "base"][i % 4], [{"role": "user", "content": a}]) for i, a in enumerate(asks)]
    t0 = time.perf_counter()
    comps = engine.generate(reqs, Sampling(max_new_tokens=16, temperature=0.0))
    seconds = time.perf_counter() - t0
    scores = engine.score_choices([Request("evaluator", [{"role": "user", "content": a}], choices=("Label: negative", "Label: positive"))
                                   for a in asks])
    samples = [Sample(tok.encode(a), c[0].token_ids or tok.encode(" ok"), group=i // 2, reward=0.0, advantage=1.0 if i % 2 else -1.0)
               for i, (a, c) in enumerate(zip(asks, comps))]
    params = activate(model, "red")
    learner = GrpoLearner(model, params, GrpoConfig(beta=0.04, max_new_tokens=16, max_tokens_per_microbatch=64), lr=1e-3, pad_id=tok.pad_token_id)
    grads = learner.gradients(samples)
    off_gpu = [n for n, p in model.named_parameters() if p.device.type != device.type]
    off_gpu += [n for n, b in model.named_buffers() if b.device.type != device.type]
    return {"tokens": [c[0].token_ids for c in comps], "scores": scores, "grads": [g.float().cpu() for g in grads],
            "generate_seconds": round(seconds, 3), "off_device": off_gpu[:5], "sharded": is_sharded(model)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", str(ROOT / "bench" / "results")), "gpu_fsdp_check.json"))
    ap.add_argument("--dry-run", action="store_true", help="gloo on the CPU: check the script itself")
    args = ap.parse_args()
    import torch

    from lora_triplay.tiny import build_tiny_qwen3
    from lora_triplay.training.sharding import device_mesh

    cuda = torch.cuda.is_available() and not args.dry_run
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    torch.distributed.init_process_group("nccl" if cuda else "gloo")
    folder = str(build_tiny_qwen3(Path(tempfile.mkdtemp(prefix="fsdp-check-"))))
    plain = run_checks(*build(folder, device, dtype), device)
    sharded = run_checks(*build(folder, device, dtype, mesh=device_mesh(1, device)), device)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    flat = lambda s: [x for request in s for choice in request for x in choice]  # noqa: E731
    grad_diff = max(float((a - b).abs().max()) for a, b in zip(plain["grads"], sharded["grads"]))
    grad_scale = max(float(a.abs().max()) for a in plain["grads"])
    score_diff = max(abs(a - b) for a, b in zip(flat(plain["scores"]), flat(sharded["scores"])))
    result = {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu (dry run)", "torch": torch.__version__, "dtype": str(dtype),
        "sharded": sharded["sharded"], "off_device_in_sharded": sharded["off_device"],
        "same_tokens": plain["tokens"] == sharded["tokens"], "largest_score_difference": score_diff,
        "largest_gradient_difference": grad_diff, "gradient_scale": grad_scale,
        "generate_seconds": {"plain": plain["generate_seconds"], "sharded": sharded["generate_seconds"]},
    }
    result["ok"] = bool(result["sharded"] and not result["off_device_in_sharded"] and result["same_tokens"]
                        and score_diff <= tol * 10 and grad_diff <= tol * max(grad_scale, 1e-6) * 10)
    print(json.dumps(result, indent=2), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    torch.distributed.destroy_process_group()
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
