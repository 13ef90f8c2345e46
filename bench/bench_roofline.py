"""Rollouts and GRPO updates against this CPU's measured roofline, in one run.

    python bench/bench_roofline.py [--threads 1] [--quick] [--compare] [--out bench/results/roofline.json]

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
             GFLOPS / FLOPs-per-token; target >= 0.5 of it. The same call
             split in two: `prefill` (the engine's _prefill: prompt
             tokens as computed, pads and a shared prefix once per adapter
             included, lm_head on one position per row) and `decode` (the
             rest of the call: one forward per step, sampling, detokenizing),
             each with tokens/s and GFLOPS; decode's tokens are the rows fed
             to decode forwards, its roofline share against the same ceiling,
             and `gemm_floor`: one step's GEMMs alone (every base Linear on
             32 rows, weights streaming from memory as in a real step).
  per_role   goal 3: the same 32 requests as 4 calls, one per adapter;
             target mixed >= 2x per role (tokens/s). Mixed and role by
             role are run twice, alternated, best of each.
  update     goal 2: one GRPO policy update (forward + backward + AdamW;
             beta 0, so no reference pass) on 2 groups x 8 completions of
             the rollout's length: tokens/s against GFLOPS / (3 x FLOPs per
             token); target >= 0.4 of it. Tokens = completion tokens plus
             each prompt once (the shared-prompt layout computes it once).
`--fast-engine 0` runs the rollouts on the PEFT reference path instead.
`--compare` adds `compare`: the mixed rollout with fastpath's ONEDNN, FUSE
and LM_HEAD_BLOCK off ("before": the fast path as it was), then each
switched on in turn ("onednn", "fused", "after" = all three), alternated
twice in this run, best of each.
The roofline (`gflops_used`) is the best of torch's matmul and oneDNN's
linear; `mkl_roofline` keeps the share against torch's matmul alone (the
ceiling of the rows measured before oneDNN was used).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from results_io import call_times, save_results

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))



def measure_gflops(shapes, repeats: int = 20) -> dict:
    """Best fp32 GEMM rate per shape: torch's own matmul (MKL on CPU) under
    the plain key, and oneDNN's linear (what the fast path uses where it
    applies) under "onednn <shape>": the roofline is the best of all, so the
    fast path's own kernel cannot beat its ceiling."""
    import torch

    from lora_triplay.engine import fastgemm

    best = {}
    for m, k, n in shapes:
        a, b = torch.randn(m, k), torch.randn(k, n)
        w = b.t().contiguous()  # a Linear's (out, in) weight
        kernels = {"": lambda: a @ b}
        if fastgemm.onednn_ok():
            kernels["onednn "] = lambda: fastgemm._onednn(a, w, None)
        for prefix, fn in kernels.items():
            with torch.no_grad():
                times = call_times(fn, repeats, warm=3)
            best[f"{prefix}{m}x{k}@{k}x{n}"] = round(2 * m * k * n / min(times) / 1e9, 1)
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
    head = base.get_output_embeddings()
    return {"linear": 2 * linear, "lora": 2 * lora, "attention": round(attention), "total": round(2 * linear + attention),
            "lm_head": 2 * head.in_features * head.out_features}


class Phases:
    """Splits engine.generate's time into the engine's `_prefill` and the
    rest (decode), and counts what their forwards computed (rows, tokens)."""

    def __init__(self, engine):
        self.reset()
        prefill, forward = engine._prefill, engine._forward

        def timed_prefill(*args, **kwargs):
            t0, self.in_prefill = time.perf_counter(), True
            try:
                return prefill(*args, **kwargs)
            finally:
                self.in_prefill = False
                self.prefill_s += time.perf_counter() - t0

        def counted_forward(names, **kwargs):
            phase = "prefill" if self.in_prefill else "decode"
            self.rows[phase] += kwargs["input_ids"].shape[0]
            self.tokens[phase] += kwargs["input_ids"].numel()
            return forward(names, **kwargs)

        engine._prefill, engine._forward = timed_prefill, counted_forward

    def reset(self):
        self.prefill_s, self.in_prefill = 0.0, False
        self.rows, self.tokens = {"prefill": 0, "decode": 0}, {"prefill": 0, "decode": 0}

    def report(self, total_s: float, flops: dict, ceiling: float) -> dict:
        per_prefill_token = flops["total"] - flops["lm_head"]  # logits_to_keep=1: lm_head once per row
        pre_flop = self.tokens["prefill"] * per_prefill_token + self.rows["prefill"] * flops["lm_head"]
        dec_s = total_s - self.prefill_s
        dec = self.tokens["decode"]
        return {
            "prefill": {"seconds": round(self.prefill_s, 3), "tokens_computed": self.tokens["prefill"],
                        "tokens_per_s": round(self.tokens["prefill"] / self.prefill_s, 1),
                        "gflops": round(pre_flop / self.prefill_s / 1e9, 1)},
            "decode": {"seconds": round(dec_s, 3), "tokens": dec, "tokens_per_s": round(dec / dec_s, 1),
                       "gflops": round(dec * flops["total"] / dec_s / 1e9, 1),
                       "fraction_of_roofline": round(dec / dec_s / ceiling, 3)},
        }


def gemm_floor(model, rows: int, repeats: int = 5) -> float:
    """Seconds of one decode step's GEMMs alone: every base Linear once, in
    the model's order, on `rows` rows, through the fast path's kernel, best
    of `repeats`. The weights stream from memory as in a real step (they do
    not fit the cache), so this is the ceiling a decode step can reach at
    this batch size with everything but the GEMMs free."""
    import torch

    from lora_triplay.engine import fastgemm, fastpath

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    weights = [m.weight for n, m in base.named_modules() if type(m) is torch.nn.Linear and "lora_" not in n]
    kernel = fastgemm.linear if fastpath.ONEDNN and fastgemm.onednn_ok() else torch.nn.functional.linear
    xs = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in weights}
    best = float("inf")
    with torch.no_grad():
        for _ in range(repeats):
            t0 = time.perf_counter()
            for w in weights:
                kernel(xs[w.shape[1]], w)
            best = min(best, time.perf_counter() - t0)
    return best


def rollouts(engine, reqs, sampling) -> tuple[float, int, int, list]:
    phases = getattr(engine, "phases", None)
    if phases is not None:
        phases.reset()
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
    ap.add_argument("--compare", action="store_true", help="also the mixed rollout before/after the fused GEMMs")
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
    engine.phases = Phases(engine)
    reqs = requests(per_adapter)
    sampling = Sampling(max_new_tokens=new_tokens, temperature=0.0)
    # warm-up at the measured shapes (the prefill's and a full decode
    # batch's): first calls pay for oneDNN's kernels and fresh pages
    rollouts(engine, reqs, Sampling(max_new_tokens=4, temperature=0.0))
    # Goals 1 and 3 side by side: (mixed, role by role) twice, alternated,
    # best of each, so that a busy moment on a shared machine does not
    # land on one side of the ratio only.
    best_mixed, role_best = None, None
    for _ in range(2):
        dt, new, prompt_tokens, out = rollouts(engine, reqs, sampling)
        if best_mixed is None or dt < best_mixed[0]:
            best_mixed = (dt, new, prompt_tokens, out)
            phases = (engine.phases.prefill_s, dict(engine.phases.rows), dict(engine.phases.tokens))
        role_s, role_new = 0.0, 0
        for a in ADAPTERS:
            d, n, _, _ = rollouts(engine, [r for r in reqs if r.adapter == a], sampling)
            role_s, role_new = role_s + d, role_new + n
        if role_best is None or role_s < role_best[0]:
            role_best = (role_s, role_new)
    dt, new, prompt_tokens, out = best_mixed
    engine.phases.prefill_s, engine.phases.rows, engine.phases.tokens = phases
    mean_context = prompt_tokens / len(reqs) + new / len(reqs) / 2
    flops = forward_flops_per_token(model, mean_context, args.rank)
    ceiling = peak * 1e9 / flops["total"]
    res["flops_per_token"] = flops
    res["rollout"] = {"requests": len(reqs), "new_tokens": new, "prompt_tokens": prompt_tokens, "seconds": round(dt, 3),
                      "tokens_per_s": round(new / dt, 1), "ceiling_tokens_per_s": round(ceiling, 1),
                      "fraction_of_roofline": round(new / dt / ceiling, 3),
                      "achieved_gflops_incl_prefill": round((new + prompt_tokens) * flops["total"] / dt / 1e9, 1)}
    res["rollout"].update(engine.phases.report(dt, flops, ceiling))
    floor_s = gemm_floor(model, len(reqs))
    res["rollout"]["decode"]["gemm_floor"] = {
        "step_seconds": round(floor_s, 4), "tokens_per_s": round(len(reqs) / floor_s, 1),
        "fraction": round(res["rollout"]["decode"]["tokens_per_s"] * floor_s / len(reqs), 3)}
    role_s, role_new = role_best
    res["per_role"] = {"seconds": round(role_s, 3), "new_tokens": role_new, "tokens_per_s": round(role_new / role_s, 1)}
    res["mixed_over_per_role"] = round(res["rollout"]["tokens_per_s"] / res["per_role"]["tokens_per_s"], 2)
    if args.compare:
        res["compare"] = compare(engine, reqs, sampling, flops, ceiling)

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
    from lora_triplay.training import frozen_linears

    # alternated in one run: the base's Linears through oneDNN (ours) and
    # through autograd's F.linear (MKL), as before training/frozen_linears.py
    times, plain_times = [], []
    for _ in range(2 if args.quick else 3):
        for enabled, into in ((False, plain_times), (True, times)):
            frozen_linears.ENABLED = enabled
            t0 = time.perf_counter()
            stats = learner.step(samples)
            into.append(time.perf_counter() - t0)
    update_s = statistics.median(times)
    trained = sum(len(s.completion_ids) for s in samples) + sum(len(c.prompt_ids) for c in red)
    train_ceiling = peak * 1e9 / (3 * flops["total"])
    res["update"] = {"samples": len(samples), "tokens": trained, "completion_tokens": stats.tokens,
                     "seconds": round(update_s, 3), "seconds_all": [round(t, 3) for t in times],
                     "tokens_per_s": round(trained / update_s, 1), "ceiling_tokens_per_s": round(train_ceiling, 1),
                     "fraction_of_roofline": round(trained / update_s / train_ceiling, 3), "layout": learner.layout,
                     "seconds_autograd_linear": round(statistics.median(plain_times), 3),
                     "speedup_over_autograd_linear": round(statistics.median(plain_times) / update_s, 3)}
    # The roofline is the best this CPU gave in this run: measured again at
    # the end, so a busy moment at the start cannot inflate the fractions.
    again = measure_gflops([(32, hidden, inter), (512, hidden, inter)])
    best = max(peak, *again.values())
    if best > peak:
        for part, mult in (("rollout", 1), ("update", 3)):
            r = res[part]
            r["ceiling_tokens_per_s"] = round(best * 1e9 / (mult * flops["total"]), 1)
            r["fraction_of_roofline"] = round(r["tokens_per_s"] / r["ceiling_tokens_per_s"], 3)
        top = res["rollout"]["ceiling_tokens_per_s"]
        runs = [c for c in res.get("compare", {}).values() if isinstance(c, dict)]
        for d in [res["rollout"]["decode"]] + [c["decode"] for c in runs] + runs:
            d["fraction_of_roofline"] = round(d["tokens_per_s"] / top, 3)
    res.update(gflops_end=again, gflops_used=best)
    mkl = max(v for k, v in list(gflops.items()) + list(again.items()) if not k.startswith("onednn"))
    mkl_ceiling = mkl * 1e9 / flops["total"]
    res["mkl_roofline"] = {"gflops": mkl, "ceiling_tokens_per_s": round(mkl_ceiling, 1),
                           "rollout_fraction": round(res["rollout"]["tokens_per_s"] / mkl_ceiling, 3),
                           "decode_fraction": round(res["rollout"]["decode"]["tokens_per_s"] / mkl_ceiling, 3),
                           "update_fraction": round(res["update"]["tokens_per_s"] / (mkl_ceiling / 3), 3)}
    res["loadavg_end"] = os.getloadavg()[0]

    print(f"GFLOPS (fp32, {args.threads} thread): start {gflops}, end {again}  -> roofline uses {best}")
    print(f"forward FLOPs/token: {flops['total'] / 1e9:.3f} G at context {mean_context:.0f}")
    r, u = res["rollout"], res["update"]
    print(f"rollout mixed  {r['tokens_per_s']:7.1f} tok/s  ceiling {r['ceiling_tokens_per_s']:.0f}  -> {r['fraction_of_roofline']:.0%} (target 50%)")
    for name in ("prefill", "decode"):
        p = r[name]
        share = f"  -> {p['fraction_of_roofline']:.0%} of the ceiling" if "fraction_of_roofline" in p else ""
        if "gemm_floor" in p:
            g = p["gemm_floor"]
            share += f", {g['fraction']:.0%} of its GEMMs alone ({g['tokens_per_s']:.0f} tok/s)"
        print(f"  {name:7s} {p['seconds']:6.2f} s  {p['tokens_per_s']:7.1f} tok/s  {p['gflops']:5.1f} GFLOPS{share}")
    print(f"rollout per role {res['per_role']['tokens_per_s']:5.1f} tok/s  -> mixed x{res['mixed_over_per_role']} (target 2x)")
    for name, c in res.get("compare", {}).items():
        if isinstance(c, dict):
            print(f"compare {name:6s} {c['tokens_per_s']:7.1f} tok/s ({c['fraction_of_roofline']:.0%})  prefill {c['prefill']['seconds']:.2f} s"
                  f"  decode {c['decode']['tokens_per_s']:.1f} tok/s {c['decode']['gflops']:.1f} GFLOPS")
    if "compare" in res:
        print(f"compare after/before: x{res['compare']['after_over_before']}")
    m = res["mkl_roofline"]
    print(f"against torch's matmul alone ({m['gflops']} GFLOPS, ceiling {m['ceiling_tokens_per_s']:.0f}): "
          f"rollout {m['rollout_fraction']:.0%}, decode {m['decode_fraction']:.0%}, GRPO update {m['update_fraction']:.0%}")
    print(f"GRPO update    {u['tokens_per_s']:7.1f} tok/s  ceiling {u['ceiling_tokens_per_s']:.0f}  -> {u['fraction_of_roofline']:.0%} (target 40%)"
          f"; x{u['speedup_over_autograd_linear']} over autograd's F.linear ({u['seconds_autograd_linear']} s)")
    save_results(args.out, res)


def compare(engine, reqs, sampling, flops, ceiling) -> dict:
    """The mixed rollout with the fused GEMMs and the blocked lm_head off
    and on, alternated (before, after, before, after), best of each."""
    from lora_triplay.engine import fastpath

    saved = fastpath.ONEDNN, fastpath.FUSE, fastpath.LM_HEAD_BLOCK
    configs = (("before", (False, False, 0)), ("onednn", (True, False, 0)), ("fused", (True, True, 0)), ("after", saved))
    best: dict = {}
    try:
        for _ in range(2):
            for name, switches in configs:
                fastpath.ONEDNN, fastpath.FUSE, fastpath.LM_HEAD_BLOCK = switches
                dt, new, _, out = rollouts(engine, reqs, sampling)
                if name not in best or dt < best[name]["seconds"]:
                    best[name] = {"seconds": round(dt, 3), "new_tokens": new, "tokens_per_s": round(new / dt, 1),
                                  "fraction_of_roofline": round(new / dt / ceiling, 3),
                                  "tokens": [c.token_ids for cs in out for c in cs],
                                  **engine.phases.report(dt, flops, ceiling)}
    finally:
        fastpath.ONEDNN, fastpath.FUSE, fastpath.LM_HEAD_BLOCK = saved
    tokens = [best[name].pop("tokens") for name, _ in configs]
    same = all(t == tokens[0] for t in tokens)
    return {**best, "after_over_before": round(best["after"]["tokens_per_s"] / best["before"]["tokens_per_s"], 2),
            "same_tokens": same}


if __name__ == "__main__":
    main()
