"""One eval update of the evidence recipe, micro-batches sized two ways, side
by side in one process: every prompt counted whole (forward.padded_tokens,
what the trainer does) or the shared prefix counted once (the tokens the
shared-prompt forward runs: bench/eval_prefix_share.py run_tokens). Same
examples, model and budget; the order alternates so a drifting host hits
both alike.

    python bench/bench_prefix_packing.py RUN_FOLDER [--repeats 3] [--budget N] [--profile] [--out FILE]

Eval's examples are a run's labelled pairs (experts.gold_pairs, as
bench/eval_prefix_share.py reads them), 8 a step as in the recipe, on the
run's base at the run's LoRA rank. Each timed call is one optimizer step
(learner.step with the supervised examples only); the adapter moves between
calls, which changes no token count. Measured 2026-12-06
(bench/results/prefix_packing.json): at the recipe's 2,048 tokens counting
the prefix once cuts 3 micro-batches to 2 and the tokens by 17.6%, and the
update's time does not move (x1.078, then x1.000: the host's noise); at
1,024 tokens it cuts 8 micro-batches to 3 and the time to x0.61. The
trainer keeps its accounting (bench/BENCHMARKS.md, "Where a seed's time
goes on a slow host").

`--profile`: one more update (the trainer's packing) under torch.profiler,
its operators' self time by kind (the frozen base's GEMMs, attention, LoRA's
small GEMMs, copies, the rest), and the GEMMs' rate beside bench/host_speed.py's:
is an eval update bound by the host's arithmetic, or by something the code
could remove?
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from eval_prefix_share import eval_examples, run_tokens
from results_io import save_results

from lora_triplay.model import activate, attach_role_adapters, load_base
from lora_triplay.recipe import load_recipe
from lora_triplay.training import forward
from lora_triplay.training.grpo import GrpoLearner
from lora_triplay.training.supervised import ChoiceExample
from lora_triplay.triplay.roles import ROLE_ADAPTERS


def prefix_once(rows, layout: str) -> int:
    """The shared prefix counted once (the tokens _shared_hidden runs)."""
    return run_tokens(rows) if rows and layout == forward.SHARED else whole_prompts(rows, layout)


whole_prompts = forward.padded_tokens


# operator name -> what it is in a LoRA update on the CPU (training/frozen_linears.py sends the base's Linears to oneDNN)
KINDS = (("mkldnn::_linear_pointwise", "frozen base GEMMs (oneDNN)"), ("flash_attention", "attention"),
         ("aten::mm", "LoRA GEMMs and other matmuls"), ("aten::copy_", "copies"))


def profile_update(learner, examples) -> dict:
    """Self CPU seconds of one update by operator kind, and the top 12 operators."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        learner.step([], examples)
        wall = time.perf_counter() - t0
    ops = sorted(((e.key, e.self_cpu_time_total / 1e6, e.count) for e in prof.key_averages()), key=lambda o: -o[1])
    by_kind: dict[str, float] = {}
    for name, seconds, _ in ops:
        kind = next((label for key, label in KINDS if key in name), "everything else")
        by_kind[kind] = by_kind.get(kind, 0.0) + seconds
    return {"wall_seconds": round(wall, 2), "self_seconds_by_kind": {k: round(v, 2) for k, v in by_kind.items()},
            "top_operators": [{"name": n, "self_seconds": round(t, 3), "calls": c} for n, t, c in ops[:12]]}


def base_gemm_flops(model, examples, layout: str, max_tokens) -> float:
    """FLOPs of the frozen base's Linears in one update: forward and the input's
    gradient, 2 x 2 x (their weights) per token the micro-batches run (the
    prefix once per micro-batch, as _shared_hidden runs it)."""
    import lora_triplay.training.supervised as supervised

    weights = sum(m.weight.numel() for name, m in model.named_modules()  # not the adapters' own (lora_A/B) Linears
                  if isinstance(m, torch.nn.Linear) and "lora_" not in name and m.weight.shape[0] != model.config.vocab_size)
    tokens = sum(prefix_once([supervised._Row(e.prompt_ids, c) for e in chunk for c in e.choices], layout)
                 for chunk in supervised._chunks(examples, layout, max_tokens))
    return 4.0 * weights * tokens


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget", type=int, default=None, help="tokens a micro-batch (default: the recipe's)")
    ap.add_argument("--profile", action="store_true", help="profile one more update by operator kind")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    recipe = load_recipe(args.run / "recipe.yaml")
    if args.budget:
        recipe.grpo.max_tokens_per_microbatch = args.budget
    ids, choices, per_step = eval_examples(recipe, None)
    examples = [ChoiceExample(p, choices, i % len(choices)) for i, p in enumerate(ids[:per_step])]
    model_cfg = recipe.model.model_copy(update={"device": "cpu", "dtype": "float32"})
    base, tok, _ = load_base(model_cfg)
    model = attach_role_adapters(base, recipe.lora, seed=0, names=list(ROLE_ADAPTERS.values()))
    learner = GrpoLearner(model, activate(model, ROLE_ADAPTERS["eval"]), recipe.grpo, lr=1e-5, pad_id=tok.pad_token_id)
    import lora_triplay.training.supervised as supervised

    times: dict[str, list[float]] = {"prefix_once": [], "whole_prompts": []}
    parts: dict[str, int] = {}
    try:
        for k in range(args.repeats + 1):  # the first round warms up and is not timed
            for name, count in (("prefix_once", prefix_once), ("whole_prompts", whole_prompts))[:: 1 if k % 2 else -1]:
                supervised.padded_tokens = count  # what the supervised step sizes its micro-batches by
                parts[name] = len(supervised._chunks(examples, forward.SHARED, recipe.grpo.max_tokens_per_microbatch))
                t0 = time.perf_counter()
                learner.step([], examples)
                if k:
                    times[name].append(time.perf_counter() - t0)
    finally:
        supervised.padded_tokens = whole_prompts  # the trainer's own count, whatever happened
    med = {name: statistics.median(t) for name, t in times.items()}
    result = {"run": args.run.name, "examples": len(examples), "budget_tokens": recipe.grpo.max_tokens_per_microbatch,
              "threads": torch.get_num_threads(), "microbatches": parts, "seconds": times, "median_seconds": med,
              "ratio_prefix_once_to_whole": round(med["prefix_once"] / med["whole_prompts"], 3)}
    print(f"{len(examples)} examples, {result['budget_tokens']} tokens a micro-batch, {result['threads']} threads: "
          + ", ".join(f"{name} {parts[name]} micro-batches {med[name]:.2f} s" for name in med)
          + f"; ratio {result['ratio_prefix_once_to_whole']}")
    if args.profile:
        prof = profile_update(learner, examples)
        gemm = prof["self_seconds_by_kind"].get("frozen base GEMMs (oneDNN)")
        flops = base_gemm_flops(model, examples, forward.SHARED, recipe.grpo.max_tokens_per_microbatch)
        prof["frozen_base_gemm_gflops"] = round(flops / gemm / 1e9, 1) if gemm else None
        result["profile"] = prof
        print(f"profiled update {prof['wall_seconds']} s: " + ", ".join(f"{k} {v} s" for k, v in prof["self_seconds_by_kind"].items())
              + f"; the base's GEMMs at {prof['frozen_base_gemm_gflops']} GFLOP/s")
    if args.out:
        save_results(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
