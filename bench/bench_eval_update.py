"""One eval update of the evidence recipe, before and after the changes of
2026-12-06 (stop 61), side by side in one process.

    python bench/bench_eval_update.py RUN_FOLDER [--rounds 3] [--block 3] [--budgets 2048,4096] [--profile] [--out FILE]

Variants, each adding one change to the one before:
  before        micro-batches sized as if every prompt ran whole (the old
                forward.padded_tokens), transformers' SDPA (a masked
                grouped-query attention copies each key/value head per query
                head), glibc's heap trimming (its thresholds as a warmed-up
                process has them: TRIMMING below)
  prefix_once   + micro-batches sized by the tokens the shared-prompt forward
                runs (the prefix every prompt shares once: forward.padded_tokens now)
  grouped_sdpa  + SDPA's own grouped-query attention (engine/fastpath.grouped_sdpa)
  keep_freed    + trimming off (training/host_memory.py): the trainer now
and `grouped_sdpa@B`, `keep_freed@B` for each further budget B of
`--budgets` (tokens a micro-batch; the first is the recipe's unless given).

Each round runs every variant for `--block` updates in a row, the first
untimed (it settles what the variant allocates; an update that follows a
smaller one faults its pages in again under trimming), the order reversed
every other round, so a drifting host hits all alike. Per timed update:
wall seconds, system seconds (page faults) and minor faults.

Eval's examples are a run's labelled pairs (experts.gold_pairs, as
bench/eval_prefix_share.py reads them), 8 a step as in the recipe, on the
run's base at the run's LoRA rank; each update is one optimizer step with
the supervised examples only (the adapter moves, no token count does).

`--profile`: one more update as the trainer runs it now under
torch.profiler, its operators' self time by kind and the frozen base's GEMM
rate beside bench/host_speed.py's.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
from eval_prefix_share import eval_examples
from results_io import save_results

import lora_triplay.training.supervised as supervised
from lora_triplay.engine import fastpath
from lora_triplay.model import activate, attach_role_adapters, load_base
from lora_triplay.recipe import load_recipe
from lora_triplay.training import forward, host_memory
from lora_triplay.training.grpo import GrpoLearner
from lora_triplay.training.supervised import ChoiceExample
from lora_triplay.triplay.roles import ROLE_ADAPTERS


def whole_prompts(rows, layout: str) -> int:
    """The trainer's count before 2026-12-06: every distinct prompt whole."""
    if not rows or layout != forward.SHARED:
        return forward.padded_tokens(rows, layout)
    prompts = {tuple(r.prompt_ids) for r in rows}
    return len(prompts) * max(len(p) for p in prompts) + len(rows) * max(len(r.completion_ids) for r in rows)


# variant -> (micro-batch count, grouped SDPA, trimming off)
STAGES = {"before": (whole_prompts, False, False), "prefix_once": (forward.padded_tokens, False, False),
          "grouped_sdpa": (forward.padded_tokens, True, False), "keep_freed": (forward.padded_tokens, True, True)}


# glibc's own thresholds in a process that has freed mapped blocks of 32 MiB
# (they move up to there: mmap threshold = the largest freed block, trim
# threshold twice that); setting them fixes them, so `before` sets these
# rather than the start values (128 KiB each), which would map every
# activation afresh and make `before` look slower than the trainer was
TRIMMING = {host_memory.M_MMAP_THRESHOLD: host_memory.MMAP_THRESHOLD_MAX, host_memory.M_TRIM_THRESHOLD: 2 * host_memory.MMAP_THRESHOLD_MAX}


def use(variant: str) -> None:
    count, grouped, keep = STAGES[variant.split("@")[0]]
    supervised.padded_tokens = count  # what the supervised step sizes its micro-batches by
    fastpath.GROUPED_SDPA = grouped
    host_memory.set_options(host_memory.KEEP_FREED if keep else TRIMMING)


def trainer_as_now() -> None:
    use("keep_freed")


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
    weights = sum(m.weight.numel() for name, m in model.named_modules()  # not the adapters' own (lora_A/B) Linears
                  if isinstance(m, torch.nn.Linear) and "lora_" not in name and m.weight.shape[0] != model.config.vocab_size)
    tokens = sum(forward.padded_tokens([supervised._Row(e.prompt_ids, c) for e in chunk for c in e.choices], layout)
                 for chunk in supervised._chunks(examples, layout, max_tokens))
    return 4.0 * weights * tokens


def timed(learner, examples) -> tuple[float, float, int]:
    """Wall seconds, system seconds and minor page faults of one update."""
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    learner.step([], examples)
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    return wall, r1.ru_stime - r0.ru_stime, r1.ru_minflt - r0.ru_minflt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--block", type=int, default=3, help="updates a variant runs in a row (the first untimed)")
    ap.add_argument("--budgets", default="", help="tokens a micro-batch, comma-separated (default: the recipe's)")
    ap.add_argument("--profile", action="store_true", help="profile one more update by operator kind")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    recipe = load_recipe(args.run / "recipe.yaml")
    budgets = [int(b) for b in args.budgets.split(",") if b] or [recipe.grpo.max_tokens_per_microbatch]
    recipe.grpo.max_tokens_per_microbatch = budgets[0]
    ids, choices, per_step = eval_examples(recipe, None)
    examples = [ChoiceExample(p, choices, i % len(choices)) for i, p in enumerate(ids[:per_step])]
    model_cfg = recipe.model.model_copy(update={"device": "cpu", "dtype": "float32"})
    base, tok, _ = load_base(model_cfg)
    model = attach_role_adapters(base, recipe.lora, seed=0, names=list(ROLE_ADAPTERS.values()))
    learner = GrpoLearner(model, activate(model, ROLE_ADAPTERS["eval"]), recipe.grpo, lr=1e-5, pad_id=tok.pad_token_id)
    variants = list(STAGES) + [f"{stage}@{b}" for b in budgets[1:] for stage in ("grouped_sdpa", "keep_freed")]
    seconds = {v: [] for v in variants}
    system = {v: [] for v in variants}
    faults = {v: [] for v in variants}
    parts: dict[str, int] = {}
    try:
        for k in range(args.rounds):
            for variant in variants[:: 1 if k % 2 == 0 else -1]:
                use(variant)
                learner.cfg.max_tokens_per_microbatch = int(variant.split("@")[1]) if "@" in variant else budgets[0]
                parts[variant] = len(supervised._chunks(examples, forward.SHARED, learner.cfg.max_tokens_per_microbatch))
                for b in range(args.block):
                    wall, sys_s, flt = timed(learner, examples)
                    if b:
                        seconds[variant].append(round(wall, 3))
                        system[variant].append(round(sys_s, 3))
                        faults[variant].append(flt)
                print(f"round {k} {variant}: {seconds[variant][-(args.block - 1):]} s", flush=True)
    finally:
        trainer_as_now()
        learner.cfg.max_tokens_per_microbatch = budgets[0]
    med = {v: statistics.median(t) for v, t in seconds.items()}
    result = {"run": args.run.name, "examples": len(examples), "budget_tokens": budgets[0], "budgets": budgets,
              "threads": torch.get_num_threads(), "microbatches": parts, "seconds": seconds, "system_seconds": system,
              "minor_faults": faults, "median_seconds": {v: round(m, 2) for v, m in med.items()},
              "median_system_seconds": {v: round(statistics.median(t), 2) for v, t in system.items()},
              "ratio_to_before": {v: round(m / med["before"], 3) for v, m in med.items()}}
    print(f"{len(examples)} examples, {budgets[0]} tokens a micro-batch, {result['threads']} threads:")
    for v in variants:
        print(f"  {v:>18}: {parts[v]} micro-batches, median {med[v]:.2f} s (system {result['median_system_seconds'][v]:.2f} s), "
              f"x{result['ratio_to_before'][v]} of before")
    if args.profile:
        prof = profile_update(learner, examples)
        gemm = prof["self_seconds_by_kind"].get("frozen base GEMMs (oneDNN)")
        flops = base_gemm_flops(model, examples, forward.SHARED, budgets[0])
        prof["frozen_base_gemm_gflops"] = round(flops / gemm / 1e9, 1) if gemm else None
        result["profile"] = prof
        print(f"profiled update {prof['wall_seconds']} s: " + ", ".join(f"{k} {v} s" for k, v in prof["self_seconds_by_kind"].items())
              + f"; the base's GEMMs at {prof['frozen_base_gemm_gflops']} GFLOP/s")
    if args.out:
        save_results(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
