"""Peak memory of one GRPO policy update at Qwen3's real vocabulary.

    python bench/bench_memory.py [--tokens 4096] [--rows 8] [--out bench/results/memory.json]

A tiny Qwen3 (2 layers, hidden 64) with Qwen3's vocabulary of 151,936:
the vocabulary, not the depth, is what made log-probs need ~160 GB at paper
scale. One policy update (forward, KL reference forward, backward, AdamW)
on `rows` completions of `tokens` tokens each, in a fresh subprocess per
setting so `ru_maxrss` is that setting's own peak:

  chunked        our path (log-probs 512 tokens at a time)
  chunked+ckpt   the same with gradient checkpointing (full-sequence layout)
  unchunked      the naive float32 log_softmax over the whole vocabulary,
                 measured at short lengths only (it would not fit this
                 machine at `tokens`) and extrapolated linearly in tokens.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

from results_io import save_results

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 151_936
PROMPT = 64


def _model(checkpointing: bool):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from lora_triplay.model import attach_role_adapters
    from lora_triplay.recipe import LoraConfig
    from lora_triplay.triplay.roles import ROLE_ADAPTERS

    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, max_position_embeddings=8192, tie_word_embeddings=True)
    torch.manual_seed(0)
    base = Qwen3ForCausalLM(cfg).to(torch.float32)
    base.config._attn_implementation = "sdpa"
    for p in base.parameters():
        p.requires_grad_(False)
    if checkpointing:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return attach_role_adapters(base, LoraConfig(rank=8, alpha=16), seed=0, names=list(ROLE_ADAPTERS.values()))


def child(mode: str, rows: int, tokens: int) -> dict:
    import torch

    from lora_triplay.model import activate
    from lora_triplay.recipe import GrpoConfig
    from lora_triplay.training.grpo import GrpoLearner, Sample

    torch.manual_seed(0)
    model = _model(checkpointing=mode == "chunked+ckpt")
    params = activate(model, "red")
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, VOCAB, (PROMPT,), generator=g).tolist()
    samples = [Sample(prompt, torch.randint(0, VOCAB, (tokens,), generator=g).tolist(), 0, 0.0, advantage=(-1.0) ** i)
               for i in range(rows)]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    if mode == "unchunked":
        from tests.reference import naive_logprobs

        model.train()
        opt = torch.optim.AdamW(params, lr=1e-4)
        logp, _, cmask = naive_logprobs(model, samples, 0, with_entropy=True)
        with torch.no_grad(), model.disable_adapter():
            ref, _, _ = naive_logprobs(model, samples, 0)
        adv = torch.tensor([s.advantage for s in samples])[:, None]
        delta = ref - logp
        loss = ((-(torch.exp(logp - logp.detach()) * adv) + 0.01 * (torch.exp(delta) - delta - 1)) * cmask).sum() / cmask.sum()
        loss.backward()
        opt.step()
    else:
        learner = GrpoLearner(model, params, GrpoConfig(beta=0.01, max_new_tokens=tokens), lr=1e-4, pad_id=0)
        stats = learner.step(samples)
        assert not stats.skipped and stats.tokens == rows * tokens
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"mode": mode, "rows": rows, "completion_tokens": tokens, "vocab": VOCAB, "peak_rss_gb": round(peak / 1e9, 3),
            "rss_before_update_gb": round(before / 1e9, 3), "seconds": round(seconds, 1)}


def run_child(mode: str, rows: int, tokens: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, __file__, "--child", mode, "--rows", str(rows), "--tokens", str(tokens)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"{mode} at {tokens} tokens failed ({out.returncode}): {out.stderr[-1500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--unchunked-tokens", type=int, nargs="+", default=[128, 256, 512])
    ap.add_argument("--out", default="bench/results/memory.json")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.rows, args.tokens)))
        return

    runs = [run_child("chunked", args.rows, args.tokens), run_child("chunked+ckpt", args.rows, args.tokens)]
    naive = [run_child("unchunked", args.rows, t) for t in args.unchunked_tokens]
    # Linear fit of the naive peak in tokens (logits grow linearly), extrapolated.
    xs, ys = [r["completion_tokens"] for r in naive], [r["peak_rss_gb"] for r in naive]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    estimate = my + slope * (args.tokens - mx)
    main_run = runs[0]
    result = {
        "vocab": VOCAB, "rows": args.rows, "completion_tokens": args.tokens, "peak_rss_gb": main_run["peak_rss_gb"],
        "runs": runs, "unchunked_measured": naive,
        "unchunked_estimate_gb": round(estimate, 1),
        "unchunked_logits_alone_gb": round(args.rows * (args.tokens + 1) * VOCAB * 4 / 1e9, 1),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1)},
        "date": time.strftime("%Y-%m-%d"),
    }
    print(f"vocab {VOCAB:,}, {args.rows} completions x {args.tokens:,} tokens, one GRPO update (KL reference on):")
    for r in runs:
        print(f"  {r['mode']:<14} peak RSS {r['peak_rss_gb']:6.2f} GB  ({r['seconds']:.0f} s)")
    for r in naive:
        print(f"  unchunked @ {r['completion_tokens']:>5} tokens  peak RSS {r['peak_rss_gb']:6.2f} GB")
    print(f"  unchunked @ {args.tokens:>5} tokens  ~{estimate:.1f} GB (linear fit; the logits alone are {result['unchunked_logits_alone_gb']} GB): "
          f"does not fit this {result['machine']['memory_gb']} GB machine")
    save_results(ROOT / args.out, result)


if __name__ == "__main__":
    main()
