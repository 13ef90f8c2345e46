"""Rollouts and GRPO updates against this CPU's measured roofline, in one run.

    python bench/bench_roofline.py [--threads 1] [--quick] [--out bench/results/roofline.json]

What it measures, all in the same process, on the same requests:
  gflops     fp32 matmul throughput of this CPU at the model's shapes
             (32 x 576 @ 576 x 1536 and 512 x 576 @ 576 x 1536 for
             SmolLM2-135M), best of several repeats, at the start and at
             the end of the run: the best of them is the roofline.
  flops      forward FLOPs per token of the base: 2 x every Linear weight
             (lm_head included) + 4 x layers x heads x head_dim x context
             for attention, at the batch's mean context. LoRA's own FLOPs
             (2 r (in + out) per projection per row) are added for adapter rows.
  rollout    goal 1: one mixed batch of 32 requests (8 each for base, red,
             blue, eval), 48 new tokens, greedy, through the HF engine that
             `run` uses (fast path). Generated tokens/s vs the ceiling
             GFLOPS / FLOPs-per-token; target >= 0.5 of it.
  per_role   goal 3: the same 32 requests as 4 calls, one per adapter;
             target mixed >= 2x per role (tokens/s).
  update     goal 2: one GRPO policy update (forward + backward + AdamW;
             beta 0, so no reference pass) on 2 groups x 8 completions of
             the rollout's length: tokens/s against GFLOPS / (3 x FLOPs per
             token); target >= 0.4 of it. Tokens = completion tokens plus
             each prompt once (the shared-prompt layout computes it once).
`--fast-engine 0` runs the rollouts on the PEFT reference path instead.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from results_io import save_results

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))



def measure_gflops(shapes, repeats: int = 20) -> dict:
    import torch

    best = {}
    for m, k, n in shapes:
        a, b = torch.randn(m, k), torch.randn(k, n)
        for _ in range(3):
            a @ b
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t0)
        best[f"{m}x{k}@{k}x{n}"] = round(2 * m * k * n / min(times) / 1e9, 1)
    return best


def forward_flops_per_token(model, context: float, lora_rank: int = 0) -> dict:
    """FLOPs of one token's forward pass (multiply-add = 2 FLOPs): every
    base Linear (lm_head included), attention at `context`, and, for a row
    on an adapter, LoRA's two thin matmuls on every wrapped projection."""
    import torch

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    linear = sum(m.in_features * m.out_features for n, m in base.named_modules()
                 if isinstance(m, torch.nn.Linear) and "lora_" not in n)
    wrapped = [m.base_layer for m in base.modules() if isinstance(getattr(m, "base_layer", None), torch.nn.Linear)]
    lora = sum(lora_rank * (m.in_features + m.out_features) for m in wrapped)
    cfg = base.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    attention = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * head_dim * context
    return {"linear": 2 * linear, "lora": 2 * lora, "attention": round(attention), "total": round(2 * linear + attention)}


def rollouts(engine, reqs, sampling) -> tuple[float, int, int, list]:
    t0 = time.perf_counter()
    out = engine.generate(reqs, sampling)
    dt = time.perf_counter() - t0
    new = sum(len(c.token_ids) for cs in out for c in cs)
    prompt = sum(len(cs[0].prompt_ids) for cs in out)
    return dt, new, prompt, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="embedded:smollm2-135m")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--fast-engine", default="1")
    ap.add_argument("--quick", action="store_true", help="16 requests, 24 tokens")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "roofline.json"))
    args = ap.parse_args()
    os.environ["LORA_TRIPLAY_FAST_ENGINE"] = args.fast_engine
    import torch
    from bench_engines import ADAPTERS, build, requests

    from lora_triplay.engine.base import Sampling
    from lora_triplay.engine.hf import HFEngine
    from lora_triplay.model import activate
    from lora_triplay.recipe import GrpoConfig
    from lora_triplay.training.grpo import GrpoLearner, Sample

    torch.set_num_threads(args.threads)
    per_adapter, new_tokens = (4, 24) if args.quick else (8, args.max_new_tokens)
    model, tok, _, lora = build(args.base, args.rank)
    hidden = model.config.hidden_size
    inter = getattr(model.config, "intermediate_size", 4 * hidden)
    gflops = measure_gflops([(32, hidden, inter), (512, hidden, inter)])
    peak = max(gflops.values())
    res: dict = {"base": args.base, "threads": args.threads, "rank": args.rank, "platform": platform.platform(),
                 "fast_engine": args.fast_engine == "1", "gflops": gflops, "gflops_used": peak,
                 "loadavg_start": os.getloadavg()[0]}

    engine = HFEngine(model, tok, max_batch_size=64, lora=lora)
    reqs = requests(per_adapter)
    sampling = Sampling(max_new_tokens=new_tokens, temperature=0.0)
    rollouts(engine, reqs[:4], Sampling(max_new_tokens=4, temperature=0.0))  # warm-up
    dt, new, prompt_tokens, out = rollouts(engine, reqs, sampling)
    mean_context = prompt_tokens / len(reqs) + new / len(reqs) / 2
    flops = forward_flops_per_token(model, mean_context, args.rank)
    ceiling = peak * 1e9 / flops["total"]
    res["flops_per_token"] = flops
    res["rollout"] = {"requests": len(reqs), "new_tokens": new, "prompt_tokens": prompt_tokens, "seconds": round(dt, 3),
                      "tokens_per_s": round(new / dt, 1), "ceiling_tokens_per_s": round(ceiling, 1),
                      "fraction_of_roofline": round(new / dt / ceiling, 3),
                      "achieved_gflops_incl_prefill": round((new + prompt_tokens) * flops["total"] / dt / 1e9, 1)}

    role_s, role_new = 0.0, 0
    for a in ADAPTERS:
        d, n, _, _ = rollouts(engine, [r for r in reqs if r.adapter == a], sampling)
        role_s, role_new = role_s + d, role_new + n
    res["per_role"] = {"seconds": round(role_s, 3), "new_tokens": role_new, "tokens_per_s": round(role_new / role_s, 1)}
    res["mixed_over_per_role"] = round(res["rollout"]["tokens_per_s"] / res["per_role"]["tokens_per_s"], 2)

    # Goal 2: one policy update on 2 groups x 8 completions of the rollout's lengths.
    red = [cs[0] for cs, r in zip(out, reqs) if r.adapter == "red"][:2]
    samples = []
    for g, c in enumerate(red):
        for k in range(8):  # the same prompt, completions of the rollout's length with varied tokens
            ids = [(t + k) % len(tok) for t in c.token_ids] or [tok.eos_token_id]
            samples.append(Sample(c.prompt_ids, ids, g, float(k % 3), advantage=(k % 3) - 1.0))
    params = activate(model, "red")
    learner = GrpoLearner(model, params, GrpoConfig(beta=0.0, max_new_tokens=new_tokens), lr=1e-5, pad_id=tok.pad_token_id)
    learner.step(samples[:4])  # warm-up (allocates the optimizer state)
    times = []
    for _ in range(2 if args.quick else 3):
        t0 = time.perf_counter()
        stats = learner.step(samples)
        times.append(time.perf_counter() - t0)
    update_s = statistics.median(times)
    trained = sum(len(s.completion_ids) for s in samples) + sum(len(c.prompt_ids) for c in red)
    train_ceiling = peak * 1e9 / (3 * flops["total"])
    res["update"] = {"samples": len(samples), "tokens": trained, "completion_tokens": stats.tokens,
                     "seconds": round(update_s, 3), "seconds_all": [round(t, 3) for t in times],
                     "tokens_per_s": round(trained / update_s, 1), "ceiling_tokens_per_s": round(train_ceiling, 1),
                     "fraction_of_roofline": round(trained / update_s / train_ceiling, 3), "layout": learner.layout}
    # The roofline is the best this CPU gave in this run: measured again at
    # the end, so a busy moment at the start cannot inflate the fractions.
    again = measure_gflops([(32, hidden, inter), (512, hidden, inter)])
    best = max(peak, *again.values())
    if best > peak:
        for part, mult in (("rollout", 1), ("update", 3)):
            r = res[part]
            r["ceiling_tokens_per_s"] = round(best * 1e9 / (mult * flops["total"]), 1)
            r["fraction_of_roofline"] = round(r["tokens_per_s"] / r["ceiling_tokens_per_s"], 3)
    res.update(gflops_end=again, gflops_used=best)
    res["loadavg_end"] = os.getloadavg()[0]

    print(f"GFLOPS (fp32, {args.threads} thread): start {gflops}, end {again}  -> roofline uses {best}")
    print(f"forward FLOPs/token: {flops['total'] / 1e9:.3f} G at context {mean_context:.0f}")
    r, u = res["rollout"], res["update"]
    print(f"rollout mixed  {r['tokens_per_s']:7.1f} tok/s  ceiling {r['ceiling_tokens_per_s']:.0f}  -> {r['fraction_of_roofline']:.0%} (target 50%)")
    print(f"rollout per role {res['per_role']['tokens_per_s']:5.1f} tok/s  -> mixed x{res['mixed_over_per_role']} (target 2x)")
    print(f"GRPO update    {u['tokens_per_s']:7.1f} tok/s  ceiling {u['ceiling_tokens_per_s']:.0f}  -> {u['fraction_of_roofline']:.0%} (target 40%)")
    save_results(args.out, res)


if __name__ == "__main__":
    main()
