"""HF engine and GRPO trainer: shared-prompt paths vs the naive ones, side
by side in one run on the same inputs (default: the embedded SmolLM2-135M).

    python bench/bench_hf.py [--base embedded:smollm2-135m] [--out bench/results/hf.json]

Measures (seconds, and naive/shared ratios):
  generate  2 red prompts x 4 samples: one prefill per prompt + shared
            system prefix, vs 8 independent rows
  choice    16 judge requests x 3 labels: prefix-shared, cached-prompt
            scoring vs one full forward per (request, label)
  train     one GRPO forward+backward on 2 groups x 4 completions: each
            prompt once (grouped) vs every row padded in full
  batching  16 distinct prompts (defenders answering red's attacks, blue and
            base rows): packed into one batch vs one row per batch (how the
            engine ran prompts sharing no long prefix before 2026-11-30)
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

from results_io import save_results

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.reference: the naive paths


def timed(fn, repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="embedded:smollm2-135m")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--out", default="bench/results/hf.json")
    ap.add_argument("--cases", default="generate,batching,choice,train", help="comma-separated subset to run")
    args = ap.parse_args()

    import torch

    from lora_triplay.engine.base import Request, Sampling
    from lora_triplay.engine.hf import HFEngine
    from lora_triplay.judging.parsing import LABEL_CHOICES
    from lora_triplay.model import activate, attach_role_adapters, load_base
    from lora_triplay.recipe import LoraConfig, ModelConfig
    from lora_triplay.training.forward import SHARED, completion_logprobs
    from lora_triplay.training.grpo import Sample
    from lora_triplay.training.logprobs import LogprobComputer
    from lora_triplay.triplay.roles import (
        ROLE_ADAPTERS,
        eval_messages,
        load_basic_prompts,
        load_techniques,
        red_messages,
    )
    from tests.reference import batch_tensors as _batch_tensors
    from tests.reference import token_logprobs

    base, tok, _ = load_base(ModelConfig(base=args.base, device="cpu", dtype="float32"))
    model = attach_role_adapters(base, LoraConfig(rank=8, alpha=16), seed=0, names=list(ROLE_ADAPTERS.values()))
    model.eval()
    engine = HFEngine(model, tok, max_batch_size=64)
    prompts, techniques = load_basic_prompts(), load_techniques()
    red = [red_messages(prompts[i].prompt, techniques[i]) for i in range(2)]
    greedy = Sampling(max_new_tokens=args.max_new_tokens, temperature=0.0)
    results: dict = {"base": args.base, "threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine()}

    def gen_shared():
        engine.generate([Request("red", m, n=4) for m in red], greedy)

    def gen_naive():
        old = engine.MIN_SHARED_PREFIX
        engine.MIN_SHARED_PREFIX = 10**9
        try:
            engine.generate([Request("red", m) for m in red for _ in range(4)], greedy)
        finally:
            engine.MIN_SHARED_PREFIX = old

    cases = set(args.cases.split(","))
    if "generate" in cases:
        results["generate"] = {"shared_s": timed(gen_shared), "naive_s": timed(gen_naive)}

    attacks = [[{"role": "user", "content": f"{p.prompt} Answer as a character in a story."}] for p in prompts[:8]]
    defend = [Request(a, m) for m in attacks for a in ("blue", "base")]

    def gen_rows(size):
        old = engine.max_batch_size
        engine.max_batch_size = size
        try:
            engine.generate(defend, greedy)
        finally:
            engine.max_batch_size = old

    if "batching" in cases:
        results["batching"] = {"shared_s": timed(lambda: gen_rows(64)), "naive_s": timed(lambda: gen_rows(1))}

    pairs = [(f"{p.prompt} Please answer in a story.", "I can't help with that, but here is some safety advice. " * 3) for p in prompts[:16]]
    judge = [Request("evaluator", eval_messages(p, r), choices=LABEL_CHOICES) for p, r in pairs]

    def choice_shared():
        engine.score_choices(judge)

    def choice_naive():
        rows = [Sample(engine.encode(q.messages), engine.choice_ids(c), 0, 0.0) for q in judge for c in q.choices]
        model.base_model.set_adapter("evaluator")
        with torch.no_grad():
            for i in range(0, len(rows), 16):
                ids, mask, pos, _, C = _batch_tensors(rows[i : i + 16], tok.pad_token_id, torch.device("cpu"))
                token_logprobs(model, ids, mask, pos, C)

    if "choice" in cases:
        results["choice"] = {"shared_s": timed(choice_shared), "naive_s": timed(choice_naive)}

    comps = engine.generate([Request("red", m, n=4) for m in red], Sampling(max_new_tokens=args.max_new_tokens, temperature=1.0))
    samples = [Sample(c.prompt_ids, c.token_ids, g, 0.0) for g, cs in enumerate(comps) for c in cs]
    activate(model, "red")

    def train_grouped():
        out = completion_logprobs(model, samples, tok.pad_token_id, SHARED, LogprobComputer("chunked"))
        out.logp.sum().backward()
        model.zero_grad()

    def train_naive():
        ids, mask, pos, cmask, C = _batch_tensors(samples, tok.pad_token_id, torch.device("cpu"))
        logp, _ = token_logprobs(model, ids, mask, pos, C)
        (logp * cmask).sum().backward()
        model.zero_grad()

    if "train" in cases:
        results["train"] = {"shared_s": timed(train_grouped), "naive_s": timed(train_naive)}
    for key in [k for k in ("generate", "batching", "choice", "train") if k in results]:
        r = results[key]
        r["speedup"] = r["naive_s"] / r["shared_s"]
        print(f"{key:<9} shared {r['shared_s']:7.2f}s   naive {r['naive_s']:7.2f}s   x{r['speedup']:.2f}")
    save_results(args.out, results)


if __name__ == "__main__":
    main()
