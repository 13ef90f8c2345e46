"""Where a step's time goes: one smoke iteration (1 step per phase) on the
embedded model, end to end through `lora-triplay run`, before and after this
project's engine and trainer fast paths, side by side in one run.

    python bench/bench_steps.py [--quick] [--out bench/results/steps.json]

  before   LORA_TRIPLAY_FAST_ENGINE=0 (PEFT's generate for every rollout)
           and grpo.forward=full_sequence (every row padded in full)
  after    the defaults `run` uses (fast engine, shared-prompt forward)
  after_generate_judge  after, with eval and the experts answering in free
           text (rewards.judge_mode=generate, as the GPU recipes) instead of
           forced choice: where one engine call for several judges saves
           a decode loop (loop.py judge_and_semantic, experts.py one_call)
Each phase's row in metrics.jsonl is split into: generation per purpose
(seconds_red / seconds_blue / seconds_defenders / seconds_eval ...), the
panel of experts, diversity scoring (Self-BLEU + embeddings), the policy
update, the adapter sync and the checkpoint; `other` is the rest of the
rollout (rewards, parsing, the semantic judge's bookkeeping). `cpu_s` is
the run's CPU time (user + system, start-up included): on a shared machine
it moves far less than wall time when other jobs take the cores.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_io import save_results

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "recipes" / "smoke.yaml"
ONE_STEP = ["iterations=1", "phases.red.steps=1", "phases.blue.steps=1", "phases.eval.steps=1"]
CONFIGS = {
    "before": ({"LORA_TRIPLAY_FAST_ENGINE": "0"}, ["grpo.forward=full_sequence"]),
    "after": ({}, []),
    "after_generate_judge": ({}, ["rewards.judge_mode=generate"]),
}
DEFAULT = ("before", "after")  # --all adds the rest


def breakdown(row: dict) -> dict:
    parts = {k.removeprefix("seconds_"): v for k, v in row.items() if k.startswith("seconds_")}
    parts.update(update=row.get("update_seconds", 0.0), sync=row.get("sync_seconds", 0.0),
                 checkpoint=row.get("checkpoint_seconds", 0.0))
    parts["other"] = row["step_seconds"] - sum(parts.values())
    return {k: round(v, 2) for k, v in parts.items()} | {"total": round(row["step_seconds"], 2)}


def run_once(name: str, work: Path, quick: bool) -> dict:
    env_extra, overrides = CONFIGS[name]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT), **env_extra}
    small = ["grpo.max_new_tokens=16", "rewards.judge_max_new_tokens=8", "experts.max_new_tokens=8"] if quick else []
    run_dir = work / name
    cmd = [sys.executable, "-m", "lora_triplay.cli", "run", str(SMOKE), *ONE_STEP, *small, *overrides, "--run-dir", str(run_dir)]
    t0, ru0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall, ru = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = ru.ru_utime + ru.ru_stime - ru0.ru_utime - ru0.ru_stime
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "step_seconds" in r]  # steps only: eval's held-out checks are rows without timings
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "phases": {r["phase"]: breakdown(r) for r in rows},
            "steps_s": round(sum(r["step_seconds"] for r in rows), 1), "overrides": overrides, "env": env_extra}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="16 new tokens instead of the recipe's 40")
    ap.add_argument("--only", choices=list(CONFIGS), action="append", help="run this configuration (repeatable)")
    ap.add_argument("--all", action="store_true", help=f"every configuration, not only {' and '.join(DEFAULT)}")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "steps.json"))
    args = ap.parse_args()
    res: dict = {"recipe": "recipes/smoke.yaml", "one_step_overrides": ONE_STEP, "quick": args.quick}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only or (list(CONFIGS) if args.all else list(DEFAULT)):
            res[name] = run_once(name, Path(tmp), args.quick)
    if "before" in res and "after" in res:
        res["speedup_steps"] = round(res["before"]["steps_s"] / res["after"]["steps_s"], 2)
        res["speedup_wall"] = round(res["before"]["wall_s"] / res["after"]["wall_s"], 2)
    for name in CONFIGS:
        if name not in res:
            continue
        print(f"\n{name}: {res[name]['steps_s']} s in steps, {res[name]['wall_s']} s wall, {res[name]['cpu_s']} s CPU (incl. start-up)")
        for phase, parts in res[name]["phases"].items():
            top = sorted(((v, k) for k, v in parts.items() if k != "total"), reverse=True)
            print(f"  {phase:5} {parts['total']:6.1f} s: " + ", ".join(f"{k} {v:.1f}" for v, k in top if v >= 0.05))
    if "speedup_steps" in res:
        print(f"\nafter vs before: x{res['speedup_steps']} in steps, x{res['speedup_wall']} wall")
    save_results(args.out, res)


if __name__ == "__main__":
    main()
