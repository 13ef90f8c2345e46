"""Sampling a token: torch.multinomial per row against inverse CDF.

A blue step's rollout (8 requests x 8 samples x 40 tokens, the embedded
SmolLM2-135M, 2 threads) spent 2.5 s of 14.8 in aten::exponential_: each
seeded row's `torch.multinomial(probs, 1, generator=g)` draws one
exponential per vocabulary entry (49,152) every step. engine/decode.py now
draws one uniform per row and step and takes the first token whose
cumulative probability passes it. This script times, in one process,
alternating:

  sampler   one step's pick for 64 rows from 64 x V probabilities: per-row
            multinomial with per-row generators (before) vs inverse CDF
  rollout   the engine's generate for a blue step's shape with either
            sampler (the old one patched back into engine/decode.Decode)

    OMP_NUM_THREADS=2 python bench/bench_sampler.py [--base embedded:smollm2-135m] [--out bench/results/sampler.json]
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

from results_io import save_results

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def multinomial_rows(probs, generators):
    """The sampler before 2026-12-06: one multinomial per row, each on its row's generator."""
    import torch

    return torch.cat([torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(generators)])


def time_sampler(rows: int, vocab: int, repeats: int) -> dict:
    import torch

    from lora_triplay.engine.decode import sample_inverse_cdf

    probs = torch.softmax(torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)) * 3, -1)
    gens = [torch.Generator().manual_seed(i) for i in range(rows)]
    uniforms = torch.rand(rows, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    fns = {"multinomial_ms": lambda: multinomial_rows(probs, gens), "inverse_cdf_ms": lambda: sample_inverse_cdf(probs, uniforms)}
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            fn()
            t0 = time.perf_counter()
            fn()
            times[k].append((time.perf_counter() - t0) * 1000)
    out = {k: statistics.median(v) for k, v in times.items()}
    out["ratio"] = out["inverse_cdf_ms"] / out["multinomial_ms"]
    return {"rows": rows, "vocab": vocab, **out}


def old_pick(decode_cls):
    """Decode._pick with the multinomial sampler (per-row generators seeded as the rows' uniforms are)."""
    import torch

    new_init, new_pick = decode_cls.__init__, decode_cls._pick

    def init(self, sampling, eos_ids, rows, device, seen_ids=None, seeds=None):
        new_init(self, sampling, eos_ids, rows, device, seen_ids=seen_ids, seeds=seeds)
        self.gens = None if seeds is None else [torch.Generator(device=device).manual_seed(x) for x in seeds]

    def pick(self, logits, live, step):
        s = self.s
        if s.greedy or s.repetition_penalty != 1.0 or s.top_p < 1.0 or self.gens is None:
            return new_pick(self, logits, live, step)
        probs = torch.softmax(logits / s.temperature, -1)
        return multinomial_rows(probs, [self.gens[row] for row in live.tolist()])

    return init, pick


def time_rollout(base: str, prompts: int, samples: int, new_tokens: int, rounds: int) -> dict:
    import torch

    from lora_triplay.engine import decode
    from lora_triplay.engine.base import Request, Sampling
    from lora_triplay.engine.hf import HFEngine
    from lora_triplay.model import attach_role_adapters, load_base
    from lora_triplay.recipe import LoraConfig, ModelConfig
    from lora_triplay.tiny import randomize_lora_b
    from lora_triplay.triplay.roles import ROLE_ADAPTERS, blue_messages, load_basic_prompts

    model, tok, _ = load_base(ModelConfig(base=base, device="cpu", dtype="float32"))
    lora = LoraConfig(rank=16, alpha=32)
    model = attach_role_adapters(model, lora, seed=0, names=list(ROLE_ADAPTERS.values()))
    randomize_lora_b(model, seed=1, scale=0.01)
    model.eval()
    engine = HFEngine(model, tok, max_batch_size=64, lora=lora)
    reqs = [Request("blue", blue_messages(p.prompt), n=samples) for p in load_basic_prompts()[:prompts]]
    variants = {"multinomial": old_pick(decode.Decode), "inverse_cdf": (decode.Decode.__init__, decode.Decode._pick)}
    times: dict[str, list[float]] = {k: [] for k in variants}
    tokens: dict[str, list[int]] = {k: [] for k in variants}
    original = decode.Decode.__init__, decode.Decode._pick
    try:
        for r in range(rounds + 1):  # round 0 warms up
            for k, (init, pick) in (variants.items() if r % 2 == 0 else reversed(variants.items())):
                decode.Decode.__init__, decode.Decode._pick = init, pick
                t0 = time.perf_counter()
                out = engine.generate(reqs, Sampling(max_new_tokens=new_tokens, temperature=1.0, seed=r))
                if r:
                    times[k].append(time.perf_counter() - t0)
                    tokens[k].append(sum(len(c.token_ids) for cs in out for c in cs))
    finally:
        decode.Decode.__init__, decode.Decode._pick = original
    res = {"base": base, "rows": prompts * samples, "max_new_tokens": new_tokens, "rounds": rounds,
           "threads": torch.get_num_threads()}
    for k in variants:
        res[f"{k}_s"] = statistics.median(times[k])
        res[f"{k}_tokens_per_s"] = statistics.median(t / s for t, s in zip(tokens[k], times[k]))
        res[f"{k}_all_s"] = times[k]
    res["ratio"] = res["inverse_cdf_s"] / res["multinomial_s"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="embedded:smollm2-135m")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=49_152)
    ap.add_argument("--out", default="bench/results/sampler.json")
    args = ap.parse_args()
    res = {"machine": platform.processor() or platform.machine(),
           "sampler": time_sampler(args.prompts * args.samples, args.vocab, repeats=20)}
    print("sampler", res["sampler"], flush=True)
    res["rollout"] = time_rollout(args.base, args.prompts, args.samples, args.max_new_tokens, args.rounds)
    print("rollout", {k: v for k, v in res["rollout"].items() if not k.endswith("_all_s")}, flush=True)
    save_results(args.out, res)


if __name__ == "__main__":
    main()
