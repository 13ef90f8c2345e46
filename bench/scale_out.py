"""The smoke recipe on the embedded model, 1 step per phase, three ways:
1 process, 2 processes (data parallel), 2 processes with the base sharded
(model.fsdp), each timed, and whether the runs agree.

    python bench/scale_out.py [--work runs/scale-out]

On a 2-core CPU this is about correctness, not speed: two ranks share the
two cores, and a sharded base adds an all-gather per layer per forward.
Results: bench/results/scale_out.json.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from results_io import save_results  # noqa: E402

ONE_STEP = ["phases.red.steps=1", "phases.blue.steps=1", "phases.eval.steps=1"]
WAYS = {"1 process": [], "2 processes": ["--nproc", "2"], "2 processes, model.fsdp": ["--nproc", "2", "model.fsdp=true"]}


def run(work: Path, name: str, extra: list[str]) -> dict:
    folder = work / re.sub(r"[^a-z0-9]+", "-", name)
    if folder.exists():
        shutil.rmtree(folder)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "lora_triplay.cli", "run", str(ROOT / "recipes" / "smoke.yaml"), *ONE_STEP, *extra, "--run-dir", str(folder)]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    seconds = round(time.time() - t0, 1)
    (work / f"{folder.name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        raise SystemExit(f"{name} failed ({proc.returncode}); see {work / (folder.name + '.log')}")
    held = re.search(r"this rank holds ([0-9.]+)% of the model's", proc.stdout + proc.stderr)
    dummies = re.search(r"(\d+) engine forwards and (\d+) GRPO micro-batch slots", proc.stdout + proc.stderr)
    metrics = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    return {"wall_seconds": seconds, "rank0_holds_percent": float(held.group(1)) if held else 100.0,
            "lockstep_dummies": {"engine": int(dummies.group(1)), "grpo": int(dummies.group(2))} if dummies else None,
            "metrics": [{k: v for k, v in m.items() if "seconds" not in k} for m in metrics]}


def largest_difference(a: list[dict], b: list[dict]) -> float:
    worst = 0.0
    for x, y in zip(a, b):
        for k, v in x.items():
            if isinstance(v, float) and isinstance(y.get(k), float):
                worst = max(worst, abs(v - y[k]))
            elif v != y.get(k):
                return float("inf")
    return worst if len(a) == len(b) else float("inf")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default=str(ROOT / "runs" / "scale-out"))
    work = Path(ap.parse_args().work)
    work.mkdir(parents=True, exist_ok=True)
    results = {name: run(work, name, extra) for name, extra in WAYS.items()}
    ref = results["1 process"]["metrics"]
    out = {"recipe": "recipes/smoke.yaml, 1 step per phase, embedded SmolLM2-135M, OMP_NUM_THREADS=1, 2 cores",
           "ways": {name: {k: v for k, v in r.items() if k != "metrics"}
                          | {"largest_metric_difference_vs_1_process": largest_difference(ref, r["metrics"])}
                    for name, r in results.items()}}
    for name, r in out["ways"].items():
        print(f"{name:<26} {r['wall_seconds']:7.1f} s  rank 0 holds {r['rank0_holds_percent']:5.1f}%  "
              f"max metric diff vs 1 process {r['largest_metric_difference_vs_1_process']:.2e}")
    save_results(ROOT / "bench" / "results" / "scale_out.json", out)


if __name__ == "__main__":
    main()
