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
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from results_io import save_results

ROOT = Path(__file__).resolve().parents[1]
LAYOUTS = ("runtime", "one_base", "ours", "three_copies")



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
        out = engine.generate([Request(a, msgs) for a in ("base", "red", "blue", "eval")], greedy)
        stages["engine"] = rss_mb()
        learner = GrpoLearner(peft, activate(peft, "blue"), GrpoConfig(beta=0.04), lr=1e-5, pad_id=tok.pad_token_id)
        c = out[2][0]
        learner.step([Sample(c.prompt_ids, c.token_ids, 0, 1.0, advantage=1.0), Sample(c.prompt_ids, c.token_ids[:3], 0, 0.0, advantage=-1.0)])
        stages["optimizer"] = rss_mb()
        keep += [peft, engine, learner]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"rss_mb": rss_mb(), "peak_mb": round(peak / 2**20, 1), "stages_mb": stages}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="embedded:smollm2-135m")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--layout", choices=LAYOUTS, help=argparse.SUPPRESS)  # child process
    ap.add_argument("--quick", action="store_true", help="(same run; the bench is already short)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "resident.json"))
    args = ap.parse_args()
    if args.layout:
        print(json.dumps(measure(args.layout, args.base, args.rank)))
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    res: dict = {"base": args.base, "rank": args.rank, "dtype": "float32"}
    for layout in LAYOUTS:
        cmd = [sys.executable, __file__, "--layout", layout, "--base", args.base, "--rank", str(args.rank)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
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
    save_results(args.out, res)


if __name__ == "__main__":
    main()
