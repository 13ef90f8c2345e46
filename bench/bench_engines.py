"""HF engine vs vLLM engine on the same requests, in one run.

    python bench/bench_engines.py                      # embedded SmolLM2-135M
    python bench/bench_engines.py --base /path/to/tiny # any local HF folder

Measures (greedy, so both engines produce the same tokens and the token
counts are comparable; the number of rows where they agree is reported):
  hf_per_role   HF engine, one generate() call per adapter (base, red, blue, eval)
  hf_mixed      HF engine, all adapters in one generate() call
  vllm_mixed    vLLM engine, all adapters in one generate() call
  sync          one VLLMEngine.sync_adapter (save adapter + register new version)
  fresh_engine  building a VLLMEngine from scratch (vllm already imported)
Both engines get --threads CPU threads (vLLM runs in-process, idle while HF
runs). On a shared machine, check loadavg_* in the JSON before trusting it.
Prints a table and writes bench/results/engines.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from results_io import save_results

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ADAPTERS = ("base", "red", "blue", "evaluator")



def build(base_spec: str, rank: int, seed: int = 0):
    from lora_triplay.model import attach_role_adapters, load_base
    from lora_triplay.recipe import LoraConfig, ModelConfig
    from lora_triplay.tiny import randomize_lora_b
    from lora_triplay.triplay.roles import ROLE_ADAPTERS

    cfg = ModelConfig(base=base_spec, device="cpu", dtype="float32")
    base, tok, path = load_base(cfg)
    lora = LoraConfig(rank=rank, alpha=2 * rank)
    model = attach_role_adapters(base, lora, seed, list(ROLE_ADAPTERS.values()))
    randomize_lora_b(model, seed=seed + 1, scale=0.02)  # adapters that differ from the base, like trained ones
    model.eval()
    return model, tok, path, lora


def requests(per_adapter: int):
    from lora_triplay.engine.base import Request
    from lora_triplay.triplay.roles import load_basic_prompts

    prompts = [b.prompt for b in load_basic_prompts(None, None, None)][: per_adapter * len(ADAPTERS)]
    reqs = []
    for i, text in enumerate(prompts):
        reqs.append(Request(ADAPTERS[i % len(ADAPTERS)], [{"role": "user", "content": text}]))
    return reqs


def timed_generate(engine, reqs, sampling):
    t0 = time.perf_counter()
    out = engine.generate(reqs, sampling)
    dt = time.perf_counter() - t0
    tokens = sum(len(c.token_ids) for cs in out for c in cs)
    return out, dt, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="embedded:smollm2-135m")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--per-adapter", type=int, default=8, help="prompts per adapter (4 adapters)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1 if (os.cpu_count() or 1) <= 2 else os.cpu_count(),
                    help="CPU threads for both engines (HF: torch threads; vLLM: VLLM_CPU_OMP_THREADS_BIND=0..N-1); "
                    "default 1 on <= 2 cores, where 2 threads collapse (5-10x) whenever another process is busy")
    ap.add_argument("--syncs", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "engines.json"))
    args = ap.parse_args()

    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(str(i) for i in range(args.threads)))
    import torch

    from lora_triplay.engine.base import Sampling
    from lora_triplay.engine.hf import HFEngine

    torch.set_num_threads(args.threads)
    model, tok, path, lora = build(args.base, args.rank)
    reqs = requests(args.per_adapter)
    sampling = Sampling(max_new_tokens=args.max_new_tokens, temperature=0.0)
    results: dict = {
        "base": args.base, "base_path": path, "rank": args.rank, "requests": len(reqs),
        "per_adapter": args.per_adapter, "max_new_tokens": args.max_new_tokens, "greedy": True,
        "cpu_count": os.cpu_count(), "platform": platform.platform(), "threads": args.threads,
        "loadavg_start": os.getloadavg()[0],
        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"),
    }

    # ---------------------------------------------------------------- HF
    hf = HFEngine(model, tok, max_batch_size=64, lora=lora)
    timed_generate(hf, reqs[:4], Sampling(max_new_tokens=4, temperature=0.0))  # warm-up
    per_role, hf_role_tokens = {}, {}
    for a in ADAPTERS:
        sub = [r for r in reqs if r.adapter == a]
        out, dt, n = timed_generate(hf, sub, sampling)
        per_role[a] = {"seconds": round(dt, 3), "tokens": n, "tokens_per_s": round(n / dt, 1)}
        hf_role_tokens[a] = [c[0].token_ids for c in out]
    role_secs = sum(v["seconds"] for v in per_role.values())
    role_toks = sum(v["tokens"] for v in per_role.values())
    results["hf_per_role"] = {"by_adapter": per_role, "seconds": round(role_secs, 3), "tokens": role_toks,
                              "tokens_per_s": round(role_toks / role_secs, 1)}
    hf_out, dt, n = timed_generate(hf, reqs, sampling)
    results["hf_mixed"] = {"seconds": round(dt, 3), "tokens": n, "tokens_per_s": round(n / dt, 1),
                           "torch_threads": torch.get_num_threads()}

    # -------------------------------------------------------------- vLLM
    t0 = time.perf_counter()
    import vllm  # noqa: F401

    from lora_triplay.engine.vllm import VLLMEngine

    results["vllm_import_seconds"] = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    vl = VLLMEngine(path, tok, trainer=model, lora_rank=args.rank, seed=0, max_loras=4, max_cpu_loras=6, max_model_len=2048)
    for role in model.peft_config:  # red, blue, evaluator (the eval role's adapter)
        vl.sync_adapter(role)
    fresh = time.perf_counter() - t0
    timed_generate(vl, reqs[:4], Sampling(max_new_tokens=4, temperature=0.0))  # warm-up: loads adapters into slots
    vl_out, dt, n = timed_generate(vl, reqs, sampling)
    results["vllm_mixed"] = {"seconds": round(dt, 3), "tokens": n, "tokens_per_s": round(n / dt, 1),
                             "cpu_lora_patch": vl.cpu_lora_patch}
    same = sum(h[0].token_ids == v[0].token_ids for h, v in zip(hf_out, vl_out))
    results["greedy_rows_identical"] = f"{same}/{len(reqs)}"

    syncs = []
    for _ in range(args.syncs):
        t0 = time.perf_counter()
        vl.sync_adapter("red")
        syncs.append(time.perf_counter() - t0)
    # The first generate after a sync pays the adapter's load into a slot.
    _, first_after, _ = timed_generate(vl, [r for r in reqs if r.adapter == "red"][:1], Sampling(max_new_tokens=1, temperature=0.0))
    results["sync"] = {"seconds_median": round(statistics.median(syncs), 4), "seconds_all": [round(s, 4) for s in syncs],
                       "first_1_token_call_after_sync_seconds": round(first_after, 3)}
    results["fresh_engine"] = {"seconds": round(fresh, 2), "llm_startup_seconds": round(vl.startup_seconds, 2)}
    results["ratios"] = {
        "vllm_mixed_over_hf_per_role": round(results["vllm_mixed"]["tokens_per_s"] / results["hf_per_role"]["tokens_per_s"], 2),
        "vllm_mixed_over_hf_mixed": round(results["vllm_mixed"]["tokens_per_s"] / results["hf_mixed"]["tokens_per_s"], 2),
        "hf_mixed_over_hf_per_role": round(results["hf_mixed"]["tokens_per_s"] / results["hf_per_role"]["tokens_per_s"], 2),
        "fresh_engine_over_sync": round(fresh / statistics.median(syncs), 1),
    }
    results["loadavg_end"] = os.getloadavg()[0]
    vl.close()

    rows = [
        ("HF, per role (4 calls)", results["hf_per_role"]),
        ("HF, one mixed call", results["hf_mixed"]),
        ("vLLM, one mixed call", results["vllm_mixed"]),
    ]
    print(f"\n{args.base}: {len(reqs)} requests ({args.per_adapter} per adapter), greedy, max_new_tokens={args.max_new_tokens}")
    print(f"{'engine':28} {'tokens':>7} {'seconds':>8} {'tok/s':>8}")
    for name, r in rows:
        print(f"{name:28} {r['tokens']:7d} {r['seconds']:8.2f} {r['tokens_per_s']:8.1f}")
    print(f"greedy rows identical HF vs vLLM: {results['greedy_rows_identical']}")
    print(f"adapter sync: {results['sync']['seconds_median'] * 1000:.0f} ms (median of {args.syncs}); "
          f"fresh engine: {fresh:.1f} s  ->  x{results['ratios']['fresh_engine_over_sync']}")
    print("ratios:", json.dumps(results["ratios"]))
    save_results(args.out, results)


if __name__ == "__main__":
    main()
