"""Where the HF engine's decode time goes on a GPU (follow-up of
bench/gpu_check.py, whose decode stage ran at 0.6% of the HBM roofline).

A Qwen3-8B-shaped base with random bf16 weights and three LoRA adapters
(as gpu_check), then, each timed with the GPU synchronised:

  prefill      64 rows, 1,024-token prompts, 1 new token
  decode       64 rows x 16 new tokens: sampled (per-row seeds), greedy,
               sampled without per-row seeds; and 8 rows sampled
  generate     transformers' own model.generate on the bare base, 64 rows
               x 16 tokens (a reference for what the library gives)
  profile      torch.profiler over one sampled 64-row call: the top
               operators by CPU and by GPU time

    python bench/gpu_decode_profile.py [--out FILE] [--layers 36]
    python bench/gpu_decode_profile.py --dry-run     # tiny shape on the CPU
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
sys.path.insert(0, str(ROOT / "bench"))

from gpu_check import model_folder, random_base  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", str(ROOT / "bench" / "results")), "gpu_decode_profile.json"))
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()

    import torch

    from lora_triplay.engine.base import Request, Sampling
    from lora_triplay.engine.hf import HFEngine
    from lora_triplay.model import attach_role_adapters, load_tokenizer
    from lora_triplay.recipe import load_recipe
    from lora_triplay.triplay.roles import ROLE_ADAPTERS

    shape = json.loads((ROOT / "lora_triplay" / "configs" / "qwen3-8b.json").read_text())
    device = "cuda" if torch.cuda.is_available() and not args.dry_run else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    prompt_tokens, rows, new = 1024, 64, 16
    if args.dry_run:
        shape.update(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=32)
        prompt_tokens, rows, new = 64, 8, 4
    if args.layers:
        shape["num_hidden_layers"] = args.layers
    folder = model_folder(shape, Path(tempfile.mkdtemp(prefix="gpu-prof-")))
    recipe = load_recipe(ROOT / "recipes" / "8b.yaml", [f"model.base={folder}", "engine.backend=hf"])
    tok = load_tokenizer(str(folder), recipe.model)
    model = attach_role_adapters(random_base(shape, device, dtype, True), recipe.lora, seed=0, names=list(ROLE_ADAPTERS.values()))
    engine = HFEngine(model, tok, max_batch_size=64)
    text = " ".join(("safety research question about general risks " * 400).split())
    prompt = tok.decode(tok(text)["input_ids"][: prompt_tokens - 16])
    adapters = ("base", "red", "blue", "evaluator")

    def reqs(n):
        return [Request(adapters[i % 4], [{"role": "user", "content": f"{i} {prompt}"}]) for i in range(n)]

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    def timed(label, fn):
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        s = time.perf_counter() - t0
        print(f"{label}: {s:.2f}s", flush=True)
        return s, out

    res: dict = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "layers": shape["num_hidden_layers"],
                 "rows": rows, "prompt_tokens": prompt_tokens, "new_tokens": new}
    engine.generate(reqs(4), Sampling(max_new_tokens=2, temperature=0.0))  # warm-up
    res["prefill_s"], _ = timed("prefill (1 new token)", lambda: engine.generate(reqs(rows), Sampling(max_new_tokens=1, temperature=0.0)))
    cases = {"sampled_seeded": Sampling(max_new_tokens=new, temperature=1.0, seed=0),
             "greedy": Sampling(max_new_tokens=new, temperature=0.0),
             "sampled_unseeded": Sampling(max_new_tokens=new, temperature=1.0)}
    for name, s in cases.items():
        t, _ = timed(f"decode {name}", lambda s=s: engine.generate(reqs(rows), s))
        res[f"{name}_s"] = t
        res[f"{name}_ms_per_step"] = round(1000 * (t - res["prefill_s"]) / max(1, new - 1), 1)
    t, _ = timed("decode 8 rows sampled", lambda: engine.generate(reqs(8), cases["sampled_seeded"]))
    res["rows8_sampled_s"] = t

    enc = [engine.encode(r.messages) for r in reqs(rows)]
    width = max(len(x) for x in enc)
    ids = torch.tensor([[0] * (width - len(x)) + x for x in enc], device=device)
    mask = (torch.arange(width, device=device)[None] >= torch.tensor([width - len(x) for x in enc], device=device)[:, None]).long()
    model.eval()
    with model.disable_adapter():
        res["hf_generate_s"], _ = timed("transformers generate, bare base", lambda: model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False))
        res["hf_generate_prefill_s"], _ = timed("transformers generate, 1 token", lambda: model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=1, do_sample=False))
    res["hf_generate_ms_per_step"] = round(1000 * (res["hf_generate_s"] - res["hf_generate_prefill_s"]) / max(1, new - 1), 1)

    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        engine.generate(reqs(rows), Sampling(max_new_tokens=8, temperature=1.0, seed=0))
        sync()
    ka = prof.key_averages()
    by_cpu = ka.table(sort_by="self_cpu_time_total", row_limit=25)
    print(by_cpu)
    res["profile_cpu"] = by_cpu
    if device == "cuda":
        by_gpu = ka.table(sort_by="self_cuda_time_total", row_limit=20)
        print(by_gpu)
        res["profile_gpu"] = by_gpu
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({k: v for k, v in res.items() if not k.startswith("profile")}, indent=1))


if __name__ == "__main__":
    main()
