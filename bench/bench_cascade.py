"""A rollout with the prompts' cache copied into every sample's row against
cascade attention (engine/cascade.py: one row per prompt, read once per
decode step for all its samples).

Times, in one process, alternating, the HF engine's `generate` for the
rollouts of the evidence recipe's steps (the embedded SmolLM2-135M, LoRA
rank 16, the fast path):

  blue   8 requests x 8 samples x 40 tokens under blue's system prompt
         (a blue step; in a run the requests are red's wraps, longer)
  red    4 requests x 4 rewrites x 48 tokens under red's instructions with
         a wrapping technique (a red step)

Both variants sample the same tokens (tests/test_cascade.py); the script
checks that too.

    OMP_NUM_THREADS=2 python bench/bench_cascade.py [--base embedded:smollm2-135m] [--out bench/results/cascade.json]
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

from results_io import compare_variants, role_engine, save_results

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def shapes(prompts: list, techniques: list) -> dict:
    from lora_triplay.engine.base import Request
    from lora_triplay.triplay.roles import blue_messages, red_messages

    return {
        "blue": ([Request("blue", blue_messages(p.prompt), n=8) for p in prompts[:8]], 40),
        "red": ([Request("red", red_messages(p.prompt, techniques[i % len(techniques)]), n=4)
                 for i, p in enumerate(prompts[8:12])], 48),
    }


def time_shape(engine, reqs, new_tokens: int, rounds: int) -> dict:
    import torch

    from lora_triplay.engine import hf
    from lora_triplay.engine.base import Sampling

    variants = {"copied": False, "cascade": True}
    times: dict[str, list[float]] = {k: [] for k in variants}
    tokens: dict[str, list[list[int]]] = {k: [] for k in variants}
    before = hf.CASCADE
    try:
        for r in range(rounds + 1):  # round 0 warms up
            for k, on in (variants.items() if r % 2 == 0 else reversed(variants.items())):
                hf.CASCADE = on
                t0 = time.perf_counter()
                out = engine.generate(reqs, Sampling(max_new_tokens=new_tokens, temperature=1.0, seed=r))
                if r:
                    times[k].append(time.perf_counter() - t0)
                    tokens[k].append([t for cs in out for c in cs for t in c.token_ids])
    finally:
        hf.CASCADE = before
    prompt_tokens = [len(engine.encode(r.messages)) for r in reqs]
    res = {"rows": sum(r.n for r in reqs), "prompts": len(reqs), "max_new_tokens": new_tokens, "rounds": rounds,
           "prompt_tokens_mean": statistics.mean(prompt_tokens), "threads": torch.get_num_threads(),
           "same_tokens": tokens["copied"] == tokens["cascade"]}
    return {**res, **compare_variants(times, {k: [len(t) for t in v] for k, v in tokens.items()}, "copied", "cascade")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="embedded:smollm2-135m")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default="bench/results/cascade.json")
    args = ap.parse_args()

    from lora_triplay.training.host_memory import keep_freed_memory
    from lora_triplay.triplay.roles import load_basic_prompts, load_techniques

    keep_freed_memory()  # as in a run, whose trainers turn it on at the start (training/host_memory.py)
    engine = role_engine(args.base)
    res = {"machine": platform.processor() or platform.machine(), "base": args.base}
    for name, (reqs, new_tokens) in shapes(load_basic_prompts(), load_techniques()).items():
        res[name] = time_shape(engine, reqs, new_tokens, args.rounds)
        print(name, {k: v for k, v in res[name].items() if not k.endswith("_all_s")}, flush=True)
    save_results(args.out, res)


if __name__ == "__main__":
    main()
